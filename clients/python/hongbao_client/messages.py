"""The messages of the hongbao wire protocol, both directions, as plain values.

`frame.py` turns these into bytes and back; nothing here does I/O. The layouts are in
docs/protocol.md and crates/proto/src/message.rs; the classes below mirror the Rust
`Message` enum one for one, field names included, so the golden vectors
(crates/proto/testdata/golden.txt) read the same on both sides.

These are the wire's values: a system campaign's `from_user` is 0 here, as on the wire.
The client API (`results.py`, `events.py`) turns such sentinels into `None`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

#: Version byte of every frame a client writes (and the only one it reads: servers write
#: nothing else). Servers still read version 1 for the old HMAC login of the C floor
#: client; this library speaks version 2 only.
VERSION = 2
#: Largest frame body (everything after the 4-byte length prefix), in bytes.
MAX_FRAME_LEN = 16 * 1024
#: Length prefix (u32) + version (u8) + type (u8) + request id (u32).
HEADER_LEN = 10
#: Most recipients a single send may name.
MAX_RECIPIENTS = 1000
#: Longest chat, error, broadcast or kick text, in bytes of UTF-8.
MAX_TEXT_LEN = 4096
#: Longest login token (a JWT's compact form), in bytes.
MAX_TOKEN_LEN = 2048
#: Longest idempotency key of a send, in bytes of printable ASCII.
MAX_IDEMPOTENCY_KEY_LEN = 64
#: The largest amount one send may move (a larger one is `bad-request`).
MAX_PACKET_CENTS = 1_000_000_000


class ResultCode(enum.IntEnum):
    """One namespace for every reply's result: a byte means the same thing everywhere.

    The value is the wire byte; `.wire_name` is the name the docs, JSON and HTTP use.
    """

    OK = 0
    WON = 1
    NOTHING = 2
    OVERLOADED = 3
    OPENED = 4
    ALREADY_OPENED = 5
    EMPTY = 6
    NOT_A_RECIPIENT = 7
    EXPIRED = 8
    INSUFFICIENT_FUNDS = 9
    BAD_REQUEST = 10
    DELIVERED = 11
    OFFLINE = 12
    BAD_TOKEN = 13
    NOT_LOGGED_IN = 14
    UNKNOWN_TYPE = 15
    NO_SUCH_PACKET = 16
    UNAVAILABLE = 17
    RATE_LIMITED = 18

    @property
    def wire_name(self) -> str:
        return self.name.lower().replace("_", "-")

    def __str__(self) -> str:
        return self.wire_name

    @classmethod
    def from_wire_name(cls, name: str) -> ResultCode:
        """The code named `name` (`already-opened`, ...); ValueError if there is none."""
        try:
            return cls[name.upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown result name {name!r}") from None


class KickReason(enum.IntEnum):
    """Why the server closes a connection; the value is the wire byte."""

    REPLACED = 1
    BAD_TOKEN = 2
    BAD_FRAME = 3
    IDLE = 4
    SLOW_READER = 5
    SHUTDOWN = 6
    #: The session's token ended and no fresh one came (the `refresh` push went unanswered).
    EXPIRED = 7
    #: The user's tokens were revoked, or the key that signed this one was removed.
    REVOKED = 8

    @property
    def wire_name(self) -> str:
        return self.name.lower().replace("_", "-")

    def __str__(self) -> str:
        return self.wire_name

    @classmethod
    def from_wire_name(cls, name: str) -> KickReason:
        try:
            return cls[name.upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown kick reason {name!r}") from None


def valid_idempotency_key(key: str) -> bool:
    """1..=MAX_IDEMPOTENCY_KEY_LEN bytes of printable ASCII, no spaces (as the server checks)."""
    return 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LEN and all(0x21 <= ord(c) <= 0x7E for c in key)


# Client → server. `KIND` is the wire type code.


@dataclass(frozen=True, slots=True)
class Login:
    KIND: ClassVar[int] = 0x01
    #: 0: whoever the token names.
    user_id: int
    #: A JWT's compact form, as ASCII bytes.
    token: bytes


@dataclass(frozen=True, slots=True)
class Shake:
    KIND: ClassVar[int] = 0x02


@dataclass(frozen=True, slots=True)
class Send:
    KIND: ClassVar[int] = 0x03
    amount_cents: int
    shares: int
    recipients: tuple[int, ...]
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Open:
    KIND: ClassVar[int] = 0x04
    packet_id: int


@dataclass(frozen=True, slots=True)
class Chat:
    KIND: ClassVar[int] = 0x05
    to_user: int
    text: str


@dataclass(frozen=True, slots=True)
class Ping:
    KIND: ClassVar[int] = 0x06
    client_time_us: int


# Server → client: replies (carry the request id of what they answer).


@dataclass(frozen=True, slots=True)
class LoginReply:
    KIND: ClassVar[int] = 0x81
    result: ResultCode
    user_id: int


@dataclass(frozen=True, slots=True)
class ShakeReply:
    KIND: ClassVar[int] = 0x82
    result: ResultCode
    packet_id: int
    amount_cents: int
    # Only with `overloaded` or `rate-limited`, and only when the server names a wait: on
    # the wire it is left out rather than written as 0, so None here, never 0.
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SendReply:
    KIND: ClassVar[int] = 0x83
    result: ResultCode
    packet_id: int
    balance_cents: int


@dataclass(frozen=True, slots=True)
class OpenReply:
    KIND: ClassVar[int] = 0x84
    result: ResultCode
    packet_id: int
    amount_cents: int


@dataclass(frozen=True, slots=True)
class ChatReply:
    KIND: ClassVar[int] = 0x85
    result: ResultCode


@dataclass(frozen=True, slots=True)
class Pong:
    KIND: ClassVar[int] = 0x86
    client_time_us: int
    server_time_us: int


@dataclass(frozen=True, slots=True)
class Error:
    """A frame the server could not act on (unknown type, bad payload, not logged in)."""

    KIND: ClassVar[int] = 0x87
    result: ResultCode
    text: str
    # With `rate-limited`: when the request would be allowed. Left out on the wire rather
    # than written as 0, so None here, never 0.
    retry_after_ms: int | None = None


# Server → client: pushes (request id 0).


@dataclass(frozen=True, slots=True)
class PacketNotice:
    KIND: ClassVar[int] = 0x90
    packet_id: int
    from_user: int
    amount_cents: int
    shares: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class ChatMessage:
    KIND: ClassVar[int] = 0x91
    from_user: int
    text: str


@dataclass(frozen=True, slots=True)
class Broadcast:
    KIND: ClassVar[int] = 0x92
    server_time_us: int
    text: str


@dataclass(frozen=True, slots=True)
class Kick:
    KIND: ClassVar[int] = 0x93
    reason: KickReason
    text: str
    # Come back after about this long (a server draining its connections spreads them
    # over a window). Left out on the wire rather than written as 0, so None here, never 0.
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Refresh:
    """The session's token ends at `expires_at_ms`: log in again on the same connection
    with a fresh token of the same user, and the session goes on."""

    KIND: ClassVar[int] = 0x94
    expires_at_ms: int


ClientMessage = Login | Shake | Send | Open | Chat | Ping
ReplyMessage = LoginReply | ShakeReply | SendReply | OpenReply | ChatReply | Pong | Error
PushMessage = PacketNotice | ChatMessage | Broadcast | Kick | Refresh
Message = ClientMessage | ReplyMessage | PushMessage

#: Every message class by its wire type code.
BY_KIND: dict[int, type] = {
    cls.KIND: cls
    for cls in (
        Login, Shake, Send, Open, Chat, Ping,
        LoginReply, ShakeReply, SendReply, OpenReply, ChatReply, Pong, Error,
        PacketNotice, ChatMessage, Broadcast, Kick, Refresh,
    )
}


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: the request id (echoed in the reply; 0 on pushes) and its message."""

    request_id: int
    message: Message

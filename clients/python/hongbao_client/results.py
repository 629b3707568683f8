"""What each request answers, as typed values (never strings to compare).

Each result carries the server's `ResultCode` and the reply's fields; a field that only
some results fill is None otherwise (the wire writes 0 there). `error` holds the
server's explanation when it refused the request as a whole (a binary `error` frame, or
an HTTP answer with an `"error"` field), e.g. an idempotency key reused for a different
send; the `result` is then `bad-request`, `unavailable`, `rate-limited` (with
`retry_after_ms`: when the request would be allowed), ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import messages as wire
from .messages import ResultCode


@dataclass(frozen=True, slots=True)
class Shake:
    result: ResultCode
    packet_id: int | None = None
    amount_cents: int = 0
    #: With `overloaded` or `rate-limited`: how long the server asked this user not to
    #: shake (ms); None when it named no wait. The client already holds its next shake
    #: back accordingly.
    retry_after_ms: int | None = None
    error: str | None = None

    @property
    def won(self) -> bool:
        return self.result is ResultCode.WON

    @staticmethod
    def from_reply(reply: wire.ShakeReply | wire.Error) -> Shake:
        if isinstance(reply, wire.Error):
            return Shake(reply.result, retry_after_ms=reply.retry_after_ms, error=reply.text)
        return Shake(reply.result, reply.packet_id or None, reply.amount_cents, reply.retry_after_ms)


@dataclass(frozen=True, slots=True)
class Send:
    result: ResultCode
    packet_id: int | None = None
    #: My balance after the send (`ok`), or the balance that was too low
    #: (`insufficient-funds`); None when the reply carried none.
    balance_cents: int | None = None
    #: The key the send went under: pass it again to retry the same send.
    idempotency_key: str | None = None
    error: str | None = None
    #: With `rate-limited`: the wait before the send would be allowed (ms).
    retry_after_ms: int | None = None

    @property
    def ok(self) -> bool:
        return self.result is ResultCode.OK

    @staticmethod
    def from_reply(reply: wire.SendReply | wire.Error, key: str | None) -> Send:
        if isinstance(reply, wire.Error):
            return Send(reply.result, idempotency_key=key, error=reply.text, retry_after_ms=reply.retry_after_ms)
        balance = reply.balance_cents if reply.result in (ResultCode.OK, ResultCode.INSUFFICIENT_FUNDS) else None
        return Send(reply.result, reply.packet_id or None, balance, key)


@dataclass(frozen=True, slots=True)
class Open:
    result: ResultCode
    packet_id: int
    #: My share: credited now (`opened`) or at the first open (`already-opened`).
    amount_cents: int = 0
    error: str | None = None
    #: With `rate-limited`: the wait before the open would be allowed (ms).
    retry_after_ms: int | None = None

    @property
    def credited(self) -> bool:
        """True when the share is mine, whether by this open or an earlier one."""
        return self.result in (ResultCode.OPENED, ResultCode.ALREADY_OPENED)

    @staticmethod
    def from_reply(reply: wire.OpenReply | wire.Error, packet_id: int) -> Open:
        if isinstance(reply, wire.Error):
            return Open(reply.result, packet_id, error=reply.text, retry_after_ms=reply.retry_after_ms)
        return Open(reply.result, reply.packet_id, reply.amount_cents)


@dataclass(frozen=True, slots=True)
class Chat:
    result: ResultCode
    error: str | None = None
    #: With `rate-limited`: the wait before the chat would be allowed (ms).
    retry_after_ms: int | None = None

    @property
    def delivered(self) -> bool:
        return self.result is ResultCode.DELIVERED

    @staticmethod
    def from_reply(reply: wire.ChatReply | wire.Error) -> Chat:
        if isinstance(reply, wire.Error):
            return Chat(reply.result, error=reply.text, retry_after_ms=reply.retry_after_ms)
        return Chat(reply.result)


@dataclass(frozen=True, slots=True)
class Pong:
    client_time_us: int
    server_time_us: int
    #: Round trip as this client measured it.
    rtt_us: int


@dataclass(frozen=True, slots=True)
class Me:
    """`GET /v1/me`: my committed balance and newest ledger events (newest first)."""

    user_id: int
    balance_cents: int
    #: The ledger's events as it stores them (`kind` plus its fields, `seq`, `ts_ms`):
    #: their shape is the admin API's (docs/admin-api.md), left as dicts.
    recent_events: list[dict[str, Any]] = field(default_factory=list)

"""What the client pushes to `Client.events()`: the server's pushes and its own
connection changes, as typed values.

A packet notice can come more than once for one packet (at each login; in cluster mode
after a failover), so `SeenPackets` remembers ids and the client hands each packet to the
caller once.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

from .messages import KickReason


@dataclass(frozen=True, slots=True)
class PacketNotice:
    """A packet names me: open it with `Client.open(packet_id)`."""

    packet_id: int
    #: The sender, or None for a system campaign's packet.
    from_user: int | None
    amount_cents: int
    shares: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class ChatMessage:
    from_user: int
    text: str


@dataclass(frozen=True, slots=True)
class Broadcast:
    server_time_us: int
    text: str


@dataclass(frozen=True, slots=True)
class Kicked:
    """The server closed this connection, and why. After `replaced`, `bad-token`,
    `expired` and `revoked` the client does not reconnect; after the others (`idle`,
    `slow-reader`, `shutdown`, `bad-frame`) it does."""

    reason: KickReason
    text: str
    #: When the server asked the client to come back (a server draining its connections
    #: on a restart spreads them over a window); None when it named no wait. The client
    #: follows it, give or take half, after a kick it comes back from.
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RefreshRequested:
    """The server asked for a fresh token: the session's token ends at `expires_at_ms`
    (Unix milliseconds). The client asks the `refresh` callback given to `connect` for
    one and logs in again with it on the same connection; with none, the session ends
    then (`Kicked(EXPIRED)`)."""

    expires_at_ms: int


class ConnectionState(enum.Enum):
    CONNECTED = "connected"  # logged in; requests flow
    DISCONNECTED = "disconnected"  # lost; a reconnect is scheduled (`retry_in_s`)
    CLOSED = "closed"  # for good: closed by the caller, or a kick not to come back from


@dataclass(frozen=True, slots=True)
class ConnectionChanged:
    state: ConnectionState
    #: Why, in words: "connection reset", "kicked: shutdown", "closed by the caller".
    cause: str = ""
    #: DISCONNECTED: seconds until the next attempt.
    retry_in_s: float | None = None
    #: The kick behind the change, if one was.
    kick: KickReason | None = None


Event = PacketNotice | ChatMessage | Broadcast | Kicked | RefreshRequested | ConnectionChanged


class SeenPackets:
    """The packet ids whose notice was handed out, newest last.

    Bounded: the oldest ids are forgotten past `capacity`. Packets live for a day by
    default, so a client that saw more than `capacity` packets in that time may see an
    old one twice; opening twice is harmless (`already-opened`, same amount).
    """

    def __init__(self, capacity: int = 100_000):
        self._ids: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity

    def first_time(self, packet_id: int) -> bool:
        """Records `packet_id`; True if it had not been seen."""
        if packet_id in self._ids:
            return False
        self._ids[packet_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._ids)

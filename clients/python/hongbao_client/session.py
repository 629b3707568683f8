"""What a transport hands the client: one logged-in life of a connection (a session).

The client (`client.py`) knows no transport. It dials a session, sends requests through
it, and when the session ends it decides whether and when to dial the next one. A TCP
session is one socket from login to close (`tcp.py`); an HTTP session is a set of
keep-alive connections that lives until the client closes it (`http_api.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from .messages import ClientMessage, Kick, KickReason, PushMessage, ReplyMessage


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """Why a session ended."""

    cause: str
    #: The kick the server sent before closing, if it sent one.
    kick: KickReason | None = None
    #: When the server asked the client to come back, in seconds: a kick's
    #: `retry_after_ms` (ignored after a kick that does not come back).
    server_wait_s: float | None = None
    #: Set when the session ended on a TLS failure no retry mends (a TLS alert answering
    #: a plain client): its requests fail with TLS, not CONNECTION_LOST.
    tls_failure: bool = False

    @classmethod
    def after_kick(cls, kick: Kick) -> SessionEnd:
        """The end a kick makes, with the wait it named, if any: the client decides from
        its reason whether to come back at all."""
        hint_s = kick.retry_after_ms / 1000 if kick.retry_after_ms else None
        return cls(f"kicked: {kick.reason.wire_name}", kick=kick.reason, server_wait_s=hint_s)


#: Called, in order of arrival, with every push the server sends.
PushHandler = Callable[[PushMessage], None]
#: Called once, synchronously, the moment a session ends (before its pending requests
#: fail), so that no request can pick a session that has just died.
EndHandler = Callable[[SessionEnd], None]


class Session(Protocol):
    alive: bool
    on_end: EndHandler | None

    async def request(self, message: ClientMessage, timeout_s: float) -> ReplyMessage:
        """The reply to `message`. Raises HongbaoError: TIMEOUT, CONNECTION_LOST (sent, the
        outcome unknown), CONNECT_FAILED (not sent), BAD_TOKEN, TLS."""
        ...

    async def ended(self) -> SessionEnd:
        """Waits for the session to end, and says why."""
        ...

    def close(self) -> None:
        ...

    async def wait_closed(self) -> None:
        """After `close()`: waits (briefly) until the connection is gone, so that a TLS
        goodbye is not cut off by an event loop that stops right after."""
        ...


#: Makes a new logged-in session; raises HongbaoError (BAD_TOKEN, TLS: do not try again;
#: CONNECT_FAILED: try again later) or OSError.
Dialer = Callable[[PushHandler], Awaitable[Session]]

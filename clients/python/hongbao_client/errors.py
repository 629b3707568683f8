"""The one error type of the client: what went wrong (a kind) and where (a source).

Results of requests are values (`results.py`): a `nothing`, an `insufficient-funds` or a
refused send is an answer, not an exception. A `HongbaoError` means no answer can be
given: the request timed out, its connection dropped with the outcome unknown, the
client was closed (by the caller, or by the server for good: `bad-token`, `replaced`),
TLS could not be agreed, or the server spoke something this client cannot read.
"""

from __future__ import annotations

import enum

from .messages import KickReason


class ErrorKind(enum.Enum):
    #: No answer within the request's timeout; a send may be retried with its key.
    TIMEOUT = "timeout"
    #: The connection ended before the answer came: the request may or may not have
    #: been done (only raised for requests that are not safe to repeat).
    CONNECTION_LOST = "connection-lost"
    #: Could not connect or log in within the connect timeout.
    CONNECT_FAILED = "connect-failed"
    #: The server refused the credentials; the client does not retry them.
    BAD_TOKEN = "bad-token"
    #: TLS cannot be agreed with the server, and a retry would not change that: its
    #: certificate is not trusted (give the CA as cafile= or cadata=) or names another
    #: host, the handshake was refused, or a plain tcp:// or http:// URL points at a port
    #: that speaks TLS. The client does not retry (tls.py).
    TLS = "tls"
    #: The client is closed: by its owner, or by a kick it must not reconnect after.
    CLOSED = "closed"
    #: The server sent bytes this client cannot read (a frame or HTTP answer).
    PROTOCOL = "protocol"
    #: The transport has no such request (e.g. `me()` over TCP with no HTTP address).
    UNSUPPORTED = "unsupported"
    #: The arguments cannot be sent (caught here, before the server sees them).
    INVALID_ARGUMENT = "invalid-argument"


class ErrorSource(enum.Enum):
    CLIENT = "client"  # this library or its caller
    SERVER = "server"  # the hongbao server said so
    NETWORK = "network"  # the connection between them


class HongbaoError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        source: ErrorSource,
        idempotency_key: str | None = None,
        kick: KickReason | None = None,
        retry_after_s: float | None = None,
        rate_limited: bool = False,
    ):
        super().__init__(message)
        self.kind = kind
        self.source = source
        #: For a send: the key to retry it with, so that money moves once.
        self.idempotency_key = idempotency_key
        #: For CLOSED by the server: the kick that closed the client.
        self.kick = kick
        #: A wait the server named before trying again (HTTP `Retry-After`), in seconds.
        self.retry_after_s = retry_after_s
        #: True when that wait is a per-user limit's (`rate-limited`): coming back any
        #: sooner is refused again, so it is waited out whole, not drawn from ½× to 1½×.
        self.rate_limited = rate_limited

    def __repr__(self) -> str:
        return f"HongbaoError({self.kind.value}, {str(self)!r}, source={self.source.value})"

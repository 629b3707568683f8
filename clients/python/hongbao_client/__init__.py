"""hongbao-client: an asyncio client of the hongbao red-packet server.

    async with hongbao_client.connect("tcp://127.0.0.1:7000", user_id=7, secret="...") as c:
        shake = await c.shake()
        if shake.won:
            print(shake.packet_id, shake.amount_cents)

`connect` picks the transport from the URL: `tcp://` speaks the binary frames of
docs/protocol.md, `http://` the HTTP API of docs/http-api.md. Both give the same
`Client` (client.py); its results and events are typed values (results.py, events.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .backoff import Backoff, ShakeGate
from .client import Client
from .errors import ErrorKind, ErrorSource, HongbaoError
from .events import (
    Broadcast,
    ChatMessage,
    ConnectionChanged,
    ConnectionState,
    Event,
    Kicked,
    PacketNotice,
)
from .http_api import HttpSession
from .messages import KickReason, ResultCode
from .results import Chat, Me, Open, Pong, Send, Shake
from .session import Dialer, PushHandler, Session
from .tcp import TcpSession
from .token import DEV_SECRET, make_token, make_token_hex, raw_token

__version__ = "0.1.0"


def parse_url(url: str) -> tuple[str, str, int]:
    """`tcp://host:port` or `http://host:port` → (scheme, host, port)."""
    scheme, sep, rest = url.partition("://")
    host, colon, port_text = rest.rstrip("/").rpartition(":")
    if not sep or not colon or scheme not in ("tcp", "http") or not port_text.isdigit():
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"{url!r} is not tcp://HOST:PORT or http://HOST:PORT",
                           source=ErrorSource.CLIENT)
    return scheme, host.strip("[]"), int(port_text)


def connect(
    url: str,
    *,
    user_id: int,
    token: str | bytes | None = None,
    secret: str | bytes | None = None,
    http_url: str | None = None,
    request_timeout_s: float = 10.0,
    connect_timeout_s: float = 10.0,
    backoff: Backoff | None = None,
    shake_gate: ShakeGate | None = None,
    events_capacity: int = 10_000,
    notice_poll_s: float = 2.0,
) -> Client:
    """A client of user `user_id` at `url`; use it as `async with connect(...) as c:`.

    Give the login `token` (32 raw bytes or 64 hex characters), or the server's `secret`
    to make it (development: `DEV_SECRET`). `http_url` lets `me()` work over TCP (the
    binary protocol has no balance request). Nothing connects until the client starts.
    """
    if (token is None) == (secret is None):
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, "give exactly one of token= and secret=",
                           source=ErrorSource.CLIENT)
    raw = make_token(secret, user_id) if secret is not None else raw_token(token)  # type: ignore[arg-type]
    scheme, host, port = parse_url(url)

    def http_dialer(http_host: str, http_port: int) -> Dialer:
        async def dial(on_push: PushHandler | None) -> Session:
            return await HttpSession.dial(http_host, http_port, user_id, raw.hex(), on_push, connect_timeout_s)
        return dial

    side_http: Callable[[], Awaitable[HttpSession]] | None = None
    dial: Dialer
    if scheme == "tcp":
        async def dial_tcp(on_push: PushHandler) -> Session:
            return await TcpSession.dial(host, port, user_id, raw, on_push)
        dial = dial_tcp
        if http_url is not None:
            _, http_host, http_port = parse_url(http_url)

            async def dial_side_http() -> HttpSession:
                # No pushes over this one: they come over the TCP session.
                return await HttpSession.dial(http_host, http_port, user_id, raw.hex(), None, connect_timeout_s)
            side_http = dial_side_http
    else:
        dial = http_dialer(host, port)
    return Client(dial, user_id=user_id, side_http=side_http, request_timeout_s=request_timeout_s,
                  connect_timeout_s=connect_timeout_s, backoff=backoff, shake_gate=shake_gate,
                  events_capacity=events_capacity, notice_poll_s=notice_poll_s)

__all__ = [
    "Backoff", "Broadcast", "Chat", "ChatMessage", "Client", "ConnectionChanged", "ConnectionState",
    "DEV_SECRET", "ErrorKind", "ErrorSource", "Event", "HongbaoError", "KickReason", "Kicked", "Me",
    "Open", "PacketNotice", "Pong", "ResultCode", "Send", "Shake", "ShakeGate", "connect", "make_token",
    "make_token_hex", "parse_url",
]

"""hongbao-client: an asyncio client of the hongbao red-packet server.

    async with hongbao_client.connect("tcp://127.0.0.1:7000", token=jwt, refresh=fresh_jwt) as c:
        shake = await c.shake()
        if shake.won:
            print(shake.packet_id, shake.amount_cents)

`connect` picks the transport from the URL: `tcp://` speaks the binary frames of
docs/protocol.md, `http://` the HTTP API of docs/http-api.md; `tcps://` and `https://`
the same over TLS (tls.py), trusting `cafile=`/`cadata=`. Both give the same
`Client` (client.py); its results and events are typed values (results.py, events.py).
Login tokens are JWTs from the app server; `make_token` mints one from the server's
secret for development and tests (token.py).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable

from .backoff import Backoff, ShakeGate
from .client import Client
from .credentials import Credentials, RefreshCallback
from .errors import ErrorKind, ErrorSource, HongbaoError
from .events import (
    Broadcast,
    ChatMessage,
    ConnectionChanged,
    ConnectionState,
    Event,
    Kicked,
    PacketNotice,
    RefreshRequested,
)
from .http_api import HttpSession
from .messages import KickReason, ResultCode
from .results import Chat, Me, Open, Pong, Send, Shake
from .session import Dialer, PushHandler, Session
from .tcp import TcpSession
from .tls import ALPN_FRAMES, ALPN_HTTP, client_context
from .token import DEFAULT_KID, DEV_SECRET, claims, make_token, token_expiry_s, token_user

__version__ = "0.1.0"


#: The schemes `connect` takes, and whether each speaks TLS.
_SCHEMES = {"tcp": False, "tcps": True, "http": False, "https": True}


def parse_url(url: str) -> tuple[str, str, int]:
    """`tcp://host:port`, `tcps://…`, `http://…` or `https://…` → (scheme, host, port)."""
    scheme, sep, rest = url.partition("://")
    host, colon, port_text = rest.rstrip("/").rpartition(":")
    if not sep or not colon or scheme not in _SCHEMES or not port_text.isdigit():
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"{url!r} is not SCHEME://HOST:PORT with SCHEME tcp, "
                           "tcps, http or https", source=ErrorSource.CLIENT)
    return scheme, host.strip("[]"), int(port_text)


def connect(
    url: str,
    *,
    token: str | None = None,
    secret: str | bytes | None = None,
    user_id: int | None = None,
    refresh: RefreshCallback | None = None,
    refresh_before_s: float = 60.0,
    http_url: str | None = None,
    cafile: str | os.PathLike[str] | None = None,
    cadata: str | bytes | None = None,
    request_timeout_s: float = 10.0,
    connect_timeout_s: float = 10.0,
    backoff: Backoff | None = None,
    shake_gate: ShakeGate | None = None,
    events_capacity: int = 10_000,
    notice_poll_s: float = 2.0,
) -> Client:
    """A client at `url`; use it as `async with connect(...) as c:`.

    Give the login `token` (a JWT from the app server), or, for development and tests,
    the server's `secret` and `user_id` to mint one (`make_token`; `DEV_SECRET` is the
    server's built-in one). `user_id` may be left out with a token: the client logs in
    as whoever the token names (`c.user_id` says who).

    `refresh(user_id)` is how a session outlives its token: called when the server asks
    for a fresh token (the `refresh` push, over TCP) or, over HTTP, before a request when
    the token is within `refresh_before_s` of its `exp`; it returns a fresh JWT (or an
    awaitable of one: an async function is fine), or None to let the session lapse (it
    is then kicked `expired`, and the client closes). With `secret` and no `refresh`, the
    client mints its fresh tokens itself.

    `http_url` lets `me()` work over TCP (the binary protocol has no balance request).

    TLS: `tcps://` and `https://` (and an `https://` `http_url`) trust the CA in `cafile`
    (a PEM file) or `cadata` (PEM text), else the system's CAs; the server's certificate
    must name the URL's host or IP address. A certificate not trusted, or a plain URL at
    a TLS port, raises HongbaoError TLS at once and the client does not retry.

    Nothing connects until the client starts.
    """
    if (token is None) == (secret is None):
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, "give exactly one of token= and secret=",
                           source=ErrorSource.CLIENT)
    if secret is not None:
        if not user_id:
            raise HongbaoError(ErrorKind.INVALID_ARGUMENT, "secret= mints a token for user_id=: give it",
                               source=ErrorSource.CLIENT)
        token = make_token(secret, user_id)
        if refresh is None:
            minting_secret = secret

            def mint(user: int) -> str:
                return make_token(minting_secret, user)
            refresh = mint
    if not isinstance(token, str) or not token:
        raise HongbaoError(ErrorKind.INVALID_ARGUMENT, "token= is a JWT's compact form, a non-empty str",
                           source=ErrorSource.CLIENT)
    credentials = Credentials(token, user_id=user_id, refresh=refresh, refresh_before_s=refresh_before_s)
    scheme, host, port = parse_url(url)

    def tls_for(scheme: str, alpn: str) -> ssl.SSLContext | None:
        # Made once per client: the connections of its reconnects share it.
        if not _SCHEMES[scheme]:
            return None
        try:
            return client_context(alpn, cafile=cafile, cadata=cadata)
        except (OSError, ValueError) as e:  # no such file; not PEM (ssl.SSLError is an OSError)
            raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"the CA to trust (cafile=, cadata=): {e}",
                               source=ErrorSource.CLIENT) from e

    side_http: Callable[[], Awaitable[HttpSession]] | None = None
    dial: Dialer
    if scheme in ("tcp", "tcps"):
        frames_tls = tls_for(scheme, ALPN_FRAMES)

        async def dial_tcp(on_push: PushHandler) -> Session:
            return await TcpSession.dial(host, port, credentials.login_user, await credentials.for_login(), on_push,
                                         frames_tls)
        dial = dial_tcp
        if http_url is not None:
            http_scheme, http_host, http_port = parse_url(http_url)
            if http_scheme not in ("http", "https"):
                raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"http_url {http_url!r} is not http:// or https://",
                                   source=ErrorSource.CLIENT)
            side_tls = tls_for(http_scheme, ALPN_HTTP)

            async def dial_side_http() -> HttpSession:
                # No pushes over this one: they come over the TCP session.
                return await HttpSession.dial(http_host, http_port, credentials, None, connect_timeout_s, side_tls)
            side_http = dial_side_http
    else:
        http_tls = tls_for(scheme, ALPN_HTTP)

        async def dial_http(on_push: PushHandler | None) -> Session:
            return await HttpSession.dial(host, port, credentials, on_push, connect_timeout_s, http_tls)
        dial = dial_http
    return Client(dial, credentials=credentials, side_http=side_http, request_timeout_s=request_timeout_s,
                  connect_timeout_s=connect_timeout_s, backoff=backoff, shake_gate=shake_gate,
                  events_capacity=events_capacity, notice_poll_s=notice_poll_s)

__all__ = [
    "Backoff", "Broadcast", "Chat", "ChatMessage", "Client", "ConnectionChanged", "ConnectionState",
    "Credentials", "DEFAULT_KID", "DEV_SECRET", "ErrorKind", "ErrorSource", "Event", "HongbaoError",
    "KickReason", "Kicked", "Me", "Open", "PacketNotice", "Pong", "RefreshCallback", "RefreshRequested",
    "ResultCode", "Send", "Shake", "ShakeGate", "claims", "connect", "make_token", "parse_url",
    "token_expiry_s", "token_user",
]

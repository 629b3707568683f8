"""The HTTP transport: the same requests over the HTTP API (docs/http-api.md), over TLS
for an `https://` URL (tls.py: ALPN `http/1.1`, the server's name checked).

Each request proves its user by itself (`Authorization: Bearer <JWT>`), so a session is
no more than a pool of keep-alive connections and the credentials; it ends only when the
client closes it. There is no `refresh` push over HTTP: before each request the
credentials swap in a fresh token from the app's callback when the token is near its
`exp` (credentials.py). Answers are mapped to the binary protocol's reply messages, so
the client treats both transports alike:

- an answer with `"error"` (a refusal: bad JSON, a reused idempotency key, a
  `rate-limited` request, ...) becomes an `Error` message with its result, and its
  `retry_after_ms` (from the body, else `Retry-After`) when it names a wait;
- 401 (`bad-token`: forged, expired, revoked) raises BAD_TOKEN: the credentials will
  not get better by retrying;
- an `overloaded` shake (429) keeps `retry_after_ms` from the body, else `Retry-After`.

HTTP clients get no pushes. When the caller listens for events, the session polls
`GET /v1/notices` and hands each notice on as a push; the client drops the repeats (a
packet stays listed until it is opened). Chat messages and broadcasts reach only
connections (TCP or WebSocket), not HTTP clients.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

from . import messages as wire
from .credentials import Credentials
from .errors import ErrorKind, ErrorSource, HongbaoError
from .http1 import HttpPool, HttpResponse
from .messages import ClientMessage, ReplyMessage, ResultCode
from .results import Me
from .session import EndHandler, PushHandler, SessionEnd


class HttpSession:
    def __init__(self, pool: HttpPool, credentials: Credentials, on_push: PushHandler | None):
        self._pool = pool
        self._credentials = credentials
        #: The user the token names, as `GET /v1/me` answered at the dial.
        self.user_id = credentials.user_id
        self._on_push = on_push
        self.on_end: EndHandler | None = None
        self.alive = True
        self._end: asyncio.Future[SessionEnd] = asyncio.get_running_loop().create_future()
        self._poll_task: asyncio.Task[None] | None = None

    @classmethod
    async def dial(cls, host: str, port: int, credentials: Credentials, on_push: PushHandler | None,
                   timeout_s: float = 10.0, tls: ssl.SSLContext | None = None) -> HttpSession:
        """A session whose credentials the server has accepted (checked with `GET /v1/me`,
        which also names the user); over TLS (`https://`) with the context `tls`."""
        session = cls(HttpPool(host, port, tls=tls), credentials, on_push)
        try:
            session.user_id = (await session.me(timeout_s)).user_id
        except BaseException:
            session.close()
            raise
        return session

    async def request(self, message: ClientMessage, timeout_s: float) -> ReplyMessage:
        async with _deadline(timeout_s, message):
            match message:
                case wire.Shake():
                    response = await self._call("POST", "/v1/shake")
                    return _shake_reply(response)
                case wire.Send(amount_cents=amount, shares=shares, recipients=recipients, idempotency_key=key):
                    headers = {"Idempotency-Key": key} if key else {}
                    response = await self._call(
                        "POST", "/v1/packets", headers=headers, replay_safe=key is not None,
                        json_body={"amount_cents": amount, "shares": shares, "recipients": list(recipients)})
                    body = _answer(response)
                    return _error(body, response) or wire.SendReply(_result(body), body.get("packet_id", 0),
                                                          body.get("balance_cents", 0))
                case wire.Open(packet_id=packet_id):
                    response = await self._call("POST", f"/v1/packets/{packet_id}/open", replay_safe=True)
                    body = _answer(response)
                    return _error(body, response) or wire.OpenReply(_result(body), body.get("packet_id", packet_id),
                                                          body.get("amount_cents", 0))
                case wire.Chat(to_user=to_user, text=text):
                    response = await self._call("POST", "/v1/chat", json_body={"to_user": to_user, "text": text})
                    body = _answer(response)
                    return _error(body, response) or wire.ChatReply(_result(body))
                case wire.Ping(client_time_us=client_time_us):
                    response = await self._call("GET", "/v1/ping", replay_safe=True)
                    body = _answer(response)
                    return _error(body, response) or wire.Pong(client_time_us, body["server_time_us"])
        raise HongbaoError(ErrorKind.UNSUPPORTED, f"{type(message).__name__} has no HTTP endpoint",
                           source=ErrorSource.CLIENT)

    async def me(self, timeout_s: float) -> Me:
        async with _deadline(timeout_s, "me"):
            response = await self._call("GET", "/v1/me", replay_safe=True)
            body = _answer(response)
        if (refused := _error(body)) is not None or body["result"] != "ok":
            text = refused.text if refused is not None else body["result"]
            # `unavailable` (503) or `rate-limited` (429): nothing was read; try again, after
            # the server's wait if it names one.
            kind = ErrorKind.CONNECT_FAILED if response.status in (429, 503) else ErrorKind.PROTOCOL
            wait_s = refused.retry_after_ms / 1000 if refused is not None and refused.retry_after_ms else None
            raise HongbaoError(kind, f"GET /v1/me answered {response.status}: {text}", source=ErrorSource.SERVER,
                               retry_after_s=wait_s or _retry_after_s(response), rate_limited=response.status == 429)
        return Me(body["user"], body["balance_cents"], list(body.get("recent_events", [])))

    async def notices(self, timeout_s: float) -> list[wire.PacketNotice]:
        """The live packets naming me that I have not opened, oldest first."""
        async with _deadline(timeout_s, "notices"):
            body = _answer(await self._call("GET", "/v1/notices", replay_safe=True))
        return [
            # null `from_user` (a system campaign) is 0 on the wire: keep one form here.
            wire.PacketNotice(n["packet_id"], n.get("from_user") or 0, n["amount_cents"], n["shares"],
                              n["expires_at_ms"])
            for n in body.get("notices", [])
        ]

    def watch_notices(self, every_s: float) -> None:
        """Polls `GET /v1/notices` every `every_s` and pushes what it lists."""
        if self._poll_task is None and self._on_push is not None and self.alive:
            self._poll_task = asyncio.create_task(self._poll_notices(every_s), name="hongbao-http-notices")

    async def ended(self) -> SessionEnd:
        return await asyncio.shield(self._end)

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self._poll_task is not None:
            self._poll_task.cancel()
        end = SessionEnd("closed by the client")
        if self.on_end is not None:
            self.on_end(end)
        self._end.set_result(end)
        self._pool.close()

    async def wait_closed(self) -> None:
        """Waits until the connections `close()` closed are gone (see HttpPool.wait_closed)."""
        await self._pool.wait_closed()

    async def _poll_notices(self, every_s: float) -> None:
        assert self._on_push is not None
        while self.alive:
            started = time.monotonic()
            try:
                for notice in await self.notices(timeout_s=max(every_s, 5.0)):
                    self._on_push(notice)
            except HongbaoError:
                pass  # a missed poll is made up by the next one: the list is the state
            await asyncio.sleep(max(0.0, every_s - (time.monotonic() - started)))

    async def _call(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                    json_body: Any = None, replay_safe: bool = False) -> HttpResponse:
        auth = {"Authorization": f"Bearer {await self._credentials.for_request()}"}
        response = await self._pool.request(method, path, headers={**auth, **(headers or {})},
                                            json_body=json_body, replay_safe=replay_safe)
        if response.status == 401:
            whose = f"user {self.user_id}'s token" if self.user_id else "the token"
            why = _error_text(response)
            raise HongbaoError(ErrorKind.BAD_TOKEN, f"{method} {path}: the server refused {whose}{why}",
                               source=ErrorSource.SERVER)
        return response


class _deadline:
    """`asyncio.timeout` that raises the client's TIMEOUT error, naming the request."""

    def __init__(self, timeout_s: float, what: object):
        self._timeout = asyncio.timeout(timeout_s)
        self._timeout_s = timeout_s
        self._what = what

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._timeout.__aexit__(*exc)
        except TimeoutError:
            name = self._what if isinstance(self._what, str) else type(self._what).__name__.lower()
            raise HongbaoError(ErrorKind.TIMEOUT, f"no HTTP answer to {name} within {self._timeout_s:.1f} s",
                               source=ErrorSource.NETWORK) from None


def _answer(response: HttpResponse) -> dict[str, Any]:
    body = response.json()
    if not isinstance(body, dict) or "result" not in body:
        raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP {response.status}: not an API answer: {response.body[:200]!r}",
                           source=ErrorSource.SERVER)
    return body


def _result(body: dict[str, Any]) -> ResultCode:
    try:
        return ResultCode.from_wire_name(body["result"])
    except ValueError as e:
        raise HongbaoError(ErrorKind.PROTOCOL, str(e), source=ErrorSource.SERVER) from None


def _error(body: dict[str, Any], response: HttpResponse | None = None) -> wire.Error | None:
    """A refusal (`{"result", "error"}`) as the binary protocol's `error` message, with
    the wait it names (`retry_after_ms`, else `Retry-After`) if any."""
    if "error" not in body:
        return None
    retry_after_ms = body.get("retry_after_ms") or None
    if retry_after_ms is None and response is not None and (wait_s := _retry_after_s(response)):
        retry_after_ms = int(wait_s * 1000)
    return wire.Error(_result(body), str(body["error"]), retry_after_ms)


def _error_text(response: HttpResponse) -> str:
    """`: <the server's reason>` of a refusal, or nothing."""
    try:
        body = response.json()
    except HongbaoError:
        return ""
    return f": {body['error']}" if isinstance(body, dict) and isinstance(body.get("error"), str) else ""


def _shake_reply(response: HttpResponse) -> wire.ShakeReply | wire.Error:
    body = _answer(response)
    if (refused := _error(body, response)) is not None:
        return refused
    result = _result(body)
    retry_after_ms = body.get("retry_after_ms") or None
    waits = (ResultCode.OVERLOADED, ResultCode.RATE_LIMITED)
    if result in waits and retry_after_ms is None and (wait_s := _retry_after_s(response)):
        retry_after_ms = int(wait_s * 1000)
    return wire.ShakeReply(result, body.get("packet_id", 0), body.get("amount_cents", 0), retry_after_ms)


def _retry_after_s(response: HttpResponse) -> float | None:
    """`Retry-After` in seconds; None when absent or an HTTP date (the client then
    falls back to its own wait)."""
    try:
        return float(response.headers["retry-after"]) or None
    except (KeyError, ValueError):
        return None

"""A small HTTP/1.1 client over asyncio streams: keep-alive, Content-Length and chunked
bodies, nothing more. The HTTP API transport and the dev-server helpers use it; it never
blocks the event loop (no urllib, no threads).

A pool keeps idle keep-alive connections for reuse, one request at a time on each (the
server answers in request order, so pipelining would gain a client little and make a
lost connection lose several answers). An idle connection is dropped before the server
would drop it (`http_keepalive_secs`, 75 s by default), so a reused connection is
almost never one the server has already closed; when one is, and the request is safe to
send again, it is sent again once on a fresh connection.

Over TLS (`https://`) each connection is wrapped with the context given to the pool
(tls.py: ALPN `http/1.1`, the server's name checked). A certificate the context does not
trust raises TLS, not CONNECT_FAILED, and so does a TLS alert for an answer (a plain
`http://` URL at a TLS port): neither is worth a retry.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any

from .errors import ErrorKind, ErrorSource, HongbaoError
from .tls import is_tls_alert, plain_at_tls_port, tls_failure, wait_until_closed

#: Largest response head and body this client reads (the server's are far smaller).
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    #: Header names lowercased; repeated headers joined with ", ".
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP {self.status}: body is not JSON: {e}",
                               source=ErrorSource.SERVER) from None


class _NothingReceived(Exception):
    """The connection closed before any byte of the answer: the request may not have been
    read at all (a keep-alive connection the server closed as we reused it)."""


class HttpConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()

    @classmethod
    async def open(cls, host: str, port: int, tls: ssl.SSLContext | None = None) -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES, ssl=tls,
                                                       server_hostname=host if tls is not None else None)
        return cls(reader, writer)

    def close(self) -> None:
        self.writer.close()

    async def wait_closed(self, timeout_s: float) -> None:
        """Waits until the connection is closed (a TLS goodbye takes a round trip); cuts
        it after `timeout_s`."""
        await wait_until_closed(self.writer, timeout_s)

    async def roundtrip(self, head: bytes, body: bytes) -> tuple[HttpResponse, bool]:
        """Writes one request and reads its answer; also says whether the connection may
        carry another request."""
        self.writer.write(head + body)
        await self.writer.drain()
        try:
            raw_head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise _NothingReceived() from None
            if is_tls_alert(e.partial):
                raise HongbaoError(ErrorKind.TLS, plain_at_tls_port("https://"), source=ErrorSource.NETWORK) from None
            raise
        except asyncio.LimitOverrunError:
            raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP response head over {MAX_HEAD_BYTES} bytes",
                               source=ErrorSource.SERVER) from None
        status, version, headers = _parse_head(raw_head)
        response_body = await self._read_body(status, headers)
        connection = headers.get("connection", "").lower()
        keep_alive = version == "HTTP/1.1" and "close" not in connection and not self.reader.at_eof()
        self.idle_since = time.monotonic()
        return HttpResponse(status, headers, response_body), keep_alive

    async def _read_body(self, status: int, headers: dict[str, str]) -> bytes:
        if status in (204, 304) or 100 <= status < 200:
            return b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await self._read_chunked()
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length > MAX_BODY_BYTES:
                raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP body of {length} bytes over {MAX_BODY_BYTES}",
                                   source=ErrorSource.SERVER)
            return await self.reader.readexactly(length)
        # No length: the body runs until the server closes (and the connection is spent).
        body = bytearray()
        while chunk := await self.reader.read(64 * 1024):
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP body over {MAX_BODY_BYTES} bytes",
                                   source=ErrorSource.SERVER)
        return bytes(body)

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailers, if any, up to the blank line.
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise HongbaoError(ErrorKind.PROTOCOL, f"HTTP body over {MAX_BODY_BYTES} bytes",
                                   source=ErrorSource.SERVER)
            body += await self.reader.readexactly(size)
            await self.reader.readexactly(2)


def _parse_head(raw: bytes) -> tuple[int, str, dict[str, str]]:
    try:
        lines = raw.decode("latin-1").split("\r\n")
        version, status_text = lines[0].split(" ", 2)[:2]
        status = int(status_text)
    except (ValueError, IndexError):
        raise HongbaoError(ErrorKind.PROTOCOL, f"bad HTTP status line {raw[:80]!r}",
                           source=ErrorSource.SERVER) from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return status, version, headers


class HttpPool:
    """Keep-alive connections to one `host:port`."""

    def __init__(self, host: str, port: int, *, max_idle: int = 8, idle_limit_s: float = 50.0,
                 tls: ssl.SSLContext | None = None):
        self.host = host
        self.port = port
        #: The TLS context of `https://`; None for plain HTTP.
        self.tls = tls
        self._idle: list[HttpConnection] = []
        #: Closed by `close()`, perhaps not yet gone (`wait_closed`).
        self._closing: list[HttpConnection] = []
        self._max_idle = max_idle
        # Below the server's 75 s keep-alive timeout, with room for clock and RTT.
        self._idle_limit_s = idle_limit_s

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        json_body: Any = None,
        replay_safe: bool = False,
    ) -> HttpResponse:
        """One request and its answer. Raises HongbaoError CONNECT_FAILED when the request
        was never sent (safe to retry), CONNECTION_LOST when it was and no answer came,
        TLS when TLS cannot be agreed (not worth a retry)."""
        body = b"" if json_body is None else json.dumps(json_body, separators=(",", ":")).encode()
        head = self._head(method, path, headers or {}, body, json_body is not None)
        conn = self._take_idle()
        reused = conn is not None
        for _ in range(2):
            if conn is None:
                conn = await self._connect()
            try:
                response, keep_alive = await conn.roundtrip(head, body)
            except _NothingReceived:
                conn.close()
                if reused and replay_safe:
                    conn, reused = None, False
                    continue
                raise HongbaoError(ErrorKind.CONNECTION_LOST, f"{method} {path}: the connection closed "
                                   "before an answer", source=ErrorSource.NETWORK) from None
            except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError) as e:
                conn.close()
                raise HongbaoError(ErrorKind.CONNECTION_LOST, f"{method} {path}: {e!r}",
                                   source=ErrorSource.NETWORK) from e
            except BaseException:
                conn.close()  # a timeout or cancellation mid-answer: the stream is out of step
                raise
            if keep_alive and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                conn.close()
            return response
        raise AssertionError("unreachable: the second try raises or returns")

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._closing += self._idle
        self._idle.clear()

    async def wait_closed(self, timeout_s: float = 1.0) -> None:
        """Waits until the connections `close()` closed are closed (`timeout_s` at most,
        then cut): a TLS connection says goodbye (close_notify) before its socket goes,
        which an event loop that stops right after `close()` would leave open."""
        closing, self._closing = self._closing, []
        for conn in closing:
            await conn.wait_closed(timeout_s)

    async def aclose(self) -> None:
        self.close()
        await self.wait_closed()

    def _take_idle(self) -> HttpConnection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self._idle_limit_s and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def _connect(self) -> HttpConnection:
        try:
            return await HttpConnection.open(self.host, self.port, self.tls)
        except OSError as e:
            if (why := tls_failure(e)) is not None:
                raise HongbaoError(ErrorKind.TLS, f"connecting to {self.host}:{self.port}: {why}",
                                   source=ErrorSource.NETWORK) from e
            raise HongbaoError(ErrorKind.CONNECT_FAILED, f"connecting to {self.host}:{self.port}: {e}",
                               source=ErrorSource.NETWORK) from e

    def _head(self, method: str, path: str, headers: dict[str, str], body: bytes, is_json: bool) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if body or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        if is_json:
            lines.append("Content-Type: application/json")
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

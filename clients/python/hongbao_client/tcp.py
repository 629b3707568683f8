"""The TCP transport: one connection of binary frames (docs/protocol.md), logged in,
over TLS for a `tcps://` URL (tls.py: ALPN `hongbao/2`, the server's name checked).

The session owns the socket and its buffers. One reader task cuts the byte stream into
frames (`frame.check`, then `frame.decode`) and hands each on: a reply to the request
waiting under its id (replies may come back out of order: a losing shake at once, a
win only after the ledger commit), a push to the client. A request is written, then
waits for its own id.

When the stream ends (EOF, a reset, a kick, a frame the stream cannot be resynchronised
after), every request still waiting fails with CONNECTION_LOST: the server may or may not
have acted on it. An incomplete trailing frame (a slow reader is cut off mid-frame) is
dropped with the buffer.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from . import frame as codec
from . import messages as wire
from .errors import ErrorKind, ErrorSource, HongbaoError
from .messages import ClientMessage, Frame, ReplyMessage, ResultCode
from .session import EndHandler, PushHandler, SessionEnd
from .tls import is_tls_alert, plain_at_tls_port, tls_failure, wait_until_closed

#: Bytes asked of the socket per read: many frames at once under load.
_READ_CHUNK = 64 * 1024


class TcpSession:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_push: PushHandler):
        self._reader = reader
        self._writer = writer
        self._on_push = on_push
        self.on_end: EndHandler | None = None
        self.alive = True
        #: The user the login reply named.
        self.user_id = 0
        self._pending: dict[int, asyncio.Future[ReplyMessage]] = {}
        self._next_request_id = 1
        self._kick: wire.Kick | None = None
        self._end: asyncio.Future[SessionEnd] = asyncio.get_running_loop().create_future()
        self._read_task = asyncio.create_task(self._read_loop(), name="hongbao-tcp-reader")

    @classmethod
    async def dial(cls, host: str, port: int, user_id: int, token: str, on_push: PushHandler,
                   tls: ssl.SSLContext | None = None) -> TcpSession:
        """Connects (over TLS with the context `tls`) and logs in with the JWT `token` as
        `user_id` (0: whoever the token names). Raises HongbaoError BAD_TOKEN (the server
        refused the token: do not retry), TLS (nor then), or CONNECT_FAILED, or OSError."""
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=_READ_CHUNK, ssl=tls,
                                                           server_hostname=host if tls is not None else None)
        except ssl.SSLError as e:
            if (why := tls_failure(e)) is None:
                raise
            raise HongbaoError(ErrorKind.TLS, f"connecting to {host}:{port}: {why}", source=ErrorSource.NETWORK) from e
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Requests are small and latency matters more than packing them.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = cls(reader, writer, on_push)
        try:
            reply = await session.request(wire.Login(user_id, token.encode("utf-8")), timeout_s=30.0)
        except BaseException:
            session.close()
            raise
        if isinstance(reply, wire.LoginReply) and reply.result is ResultCode.OK:
            session.user_id = reply.user_id
            return session
        session.close()
        whose = f"user {user_id}'s token" if user_id else "the token"
        if isinstance(reply, (wire.LoginReply, wire.Error)) and reply.result is ResultCode.BAD_TOKEN:
            raise HongbaoError(ErrorKind.BAD_TOKEN, f"the server refused {whose}", source=ErrorSource.SERVER)
        if isinstance(reply, wire.Error) and reply.result is ResultCode.RATE_LIMITED:
            # Over the user's login limit (a bot reconnecting to refill its shakes): come
            # back once the wait is over, not before.
            wait_s = (reply.retry_after_ms or 0) / 1000 or None
            raise HongbaoError(ErrorKind.CONNECT_FAILED, f"the login with {whose} was refused: {reply.text}",
                               source=ErrorSource.SERVER, retry_after_s=wait_s, rate_limited=True)
        # `unavailable` (the core could not be reached): worth another try later.
        raise HongbaoError(ErrorKind.CONNECT_FAILED, f"the login with {whose} was answered {reply!r}",
                           source=ErrorSource.SERVER)

    async def request(self, message: ClientMessage, timeout_s: float) -> ReplyMessage:
        if not self.alive:
            raise HongbaoError(ErrorKind.CONNECTION_LOST, "the connection is closed", source=ErrorSource.NETWORK)
        request_id = self._take_request_id()
        reply: asyncio.Future[ReplyMessage] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        try:
            self._writer.write(codec.encode(Frame(request_id, message)))
            async with asyncio.timeout(timeout_s):
                # Bounds what this client buffers for a server that does not read.
                await self._writer.drain()
                return await reply
        except TimeoutError:
            raise HongbaoError(ErrorKind.TIMEOUT, f"no answer to {type(message).__name__.lower()} "
                               f"(request {request_id}) within {timeout_s:.1f} s",
                               source=ErrorSource.NETWORK) from None
        except (ConnectionError, OSError) as e:
            self._finish(SessionEnd(f"writing: {e}"))
            raise HongbaoError(ErrorKind.CONNECTION_LOST, f"writing request {request_id}: {e}",
                               source=ErrorSource.NETWORK) from e
        finally:
            self._pending.pop(request_id, None)

    @property
    def local_address(self) -> tuple[str, int] | None:
        """This end of the connection (host, port), e.g. to find it in the server's tables."""
        sockname = self._writer.get_extra_info("sockname")
        return (sockname[0], sockname[1]) if sockname else None

    async def ended(self) -> SessionEnd:
        return await asyncio.shield(self._end)

    def close(self) -> None:
        self._finish(SessionEnd("closed by the client"))
        self._read_task.cancel()

    async def wait_closed(self, timeout_s: float = 1.0) -> None:
        """Waits until the socket is closed after `close()` (a TLS goodbye takes a round
        trip; a loop that stopped first would leave it open); cuts it after `timeout_s`."""
        await wait_until_closed(self._writer, timeout_s)

    def _take_request_id(self) -> int:
        # Counts from 1 and skips 0 on wrap: 0 marks pushes.
        while True:
            request_id = self._next_request_id
            self._next_request_id = request_id % 0xFFFF_FFFF + 1
            if request_id not in self._pending:
                return request_id

    async def _read_loop(self) -> None:
        buf = bytearray()
        end = SessionEnd("the server closed the connection")
        read_a_frame = False
        try:
            while True:
                chunk = await self._reader.read(_READ_CHUNK)
                if not chunk:
                    break
                buf += chunk
                used = self._take_frames(buf)
                if used:
                    read_a_frame = True
                    del buf[:used]
        except codec.FrameError as e:
            end = SessionEnd(f"unreadable stream from the server: {e}")
        except (ConnectionError, OSError) as e:
            end = SessionEnd(f"reading: {e}")
        except asyncio.CancelledError:
            end = SessionEnd("closed by the client")
        if not read_a_frame and is_tls_alert(buf):
            # The answer of a TLS port to a plain client (a frame's length starts 0x00).
            end = SessionEnd(plain_at_tls_port("tcps://"), tls_failure=True)
        if self._kick is not None:
            end = SessionEnd.after_kick(self._kick)
        self._finish(end)

    def _take_frames(self, buf: bytearray) -> int:
        """Dispatches every whole frame at the start of `buf`; returns the bytes used."""
        used = 0
        with memoryview(buf) as view:
            while (size := codec.check(view[used:])) is not None:
                frame_bytes = view[used:used + size]
                used += size
                try:
                    frame = codec.decode(frame_bytes)
                except codec.FrameError as e:
                    if e.fatal:
                        raise
                    self._refuse_reply(e)
                    continue
                self._dispatch(frame)
        return used

    def _dispatch(self, frame: Frame) -> None:
        message = frame.message
        if frame.request_id == 0 and isinstance(message, (wire.PacketNotice, wire.ChatMessage,
                                                          wire.Broadcast, wire.Kick, wire.Refresh)):
            if isinstance(message, wire.Kick):
                self._kick = message
            self._on_push(message)
            return
        waiting = self._pending.get(frame.request_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(message)  # type: ignore[arg-type]
        # Else a reply to a request that timed out: nobody waits for it any more.

    def _refuse_reply(self, error: codec.FrameError) -> None:
        """A well-delimited frame we cannot read: fail the request it answers, read on."""
        waiting = self._pending.get(error.request_id or 0)
        if waiting is not None and not waiting.done():
            waiting.set_exception(HongbaoError(ErrorKind.PROTOCOL, f"unreadable reply: {error}",
                                               source=ErrorSource.SERVER))

    def _finish(self, end: SessionEnd) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.on_end is not None:
            self.on_end(end)
        self._end.set_result(end)
        if end.tls_failure:
            lost = HongbaoError(ErrorKind.TLS, end.cause, source=ErrorSource.NETWORK)
        else:
            lost = HongbaoError(ErrorKind.CONNECTION_LOST, f"connection lost before the answer came ({end.cause})",
                                source=ErrorSource.NETWORK, kick=end.kick)
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(lost)
        self._writer.close()


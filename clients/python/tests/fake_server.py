"""A scripted stand-in for the hongbao gateway, for tests of the client's own rules
(retries, back-off, kicks) that a real server cannot be made to show on cue.

It speaks real frames through the package's codec. Each connection's frames go to
`script(conn, frame)`, which returns what to answer, or `CLOSE` to drop the connection
unanswered; a list answers with several messages (pushes go out with request id 0).
Logins are answered `ok` unless the script says otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hongbao_client import frame as codec
from hongbao_client import messages as m
from hongbao_client.messages import Frame, ResultCode

CLOSE = object()


@dataclass
class Conn:
    index: int
    writer: asyncio.StreamWriter
    received: list[tuple[float, Frame]] = field(default_factory=list)

    def push(self, message: m.Message, request_id: int = 0) -> None:
        self.writer.write(codec.encode(Frame(request_id, message)))


Script = Callable[[Conn, Frame], Awaitable[object] | object]


class FakeServer:
    def __init__(self, script: Script | None = None):
        self.script = script
        self.conns: list[Conn] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.logged_in = asyncio.Event()

    async def __aenter__(self) -> FakeServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for conn in self.conns:
            conn.writer.close()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def frames(self, kind: type) -> list[tuple[float, Frame]]:
        return [(t, f) for c in self.conns for (t, f) in c.received if isinstance(f.message, kind)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(len(self.conns), writer)
        self.conns.append(conn)
        buf = bytearray()
        try:
            while chunk := await reader.read(4096):
                buf += chunk
                while (size := codec.check(buf)) is not None:
                    frame = codec.decode(bytes(buf[:size]))
                    del buf[:size]
                    conn.received.append((time.monotonic(), frame))
                    answer = self.script(conn, frame) if self.script else None
                    if asyncio.iscoroutine(answer):
                        answer = await answer
                    if answer is CLOSE:
                        writer.close()
                        return
                    if answer is None and isinstance(frame.message, m.Login):
                        answer = m.LoginReply(ResultCode.OK, frame.message.user_id)
                    if answer is not None:
                        messages: list[m.Message] = answer if isinstance(answer, list) else [answer]  # type: ignore[list-item,assignment]
                        for message in messages:
                            # Pushes (0x90 and up) carry request id 0; replies the request's.
                            conn.push(message, 0 if message.KIND >= 0x90 else frame.request_id)
                        await writer.drain()
                    if isinstance(frame.message, m.Login):
                        self.logged_in.set()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

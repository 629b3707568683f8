"""A simulated clock and a simulated gateway, for the reconnect tests.

`VirtualTimeLoop` is an asyncio event loop whose clock jumps: where a real loop would
sleep until its next timer, this one moves its clock there at once. The client reads its
deadlines and back-off waits from the loop (`client._now`), so a thousand clients dropped
together reconnect in well under a second of real time, and every wait can be read off
exactly. Nothing here may touch the network: a socket would wait on the real clock.

`SimGateway` is the server side: it hands each client a dialer (the seam `Client` is
built on) that answers a dial as the test says — a logged-in `SimSession`, a refusal, a
`503` with `Retry-After`, or nothing at all — and records when each dial came.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from hongbao_client import messages as wire
from hongbao_client.backoff import Backoff
from hongbao_client.client import Client
from hongbao_client.credentials import Credentials
from hongbao_client.errors import ErrorKind, ErrorSource, HongbaoError
from hongbao_client.messages import KickReason
from hongbao_client.session import Dialer, PushHandler, Session, SessionEnd

T = TypeVar("T")


class _JumpingSelector(selectors.BaseSelector):
    """Reports what is ready now (the loop's own wake-up pipe), and never waits: a wait
    for `timeout` seconds moves the loop's clock on by that much instead."""

    def __init__(self, loop: VirtualTimeLoop):
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("nothing is scheduled and nothing can arrive: the test would wait forever")
        self._loop.now += timeout
        return []

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 1000.0):
        self.now = start
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Runs `main` to its end on a fresh `VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


#: What the gateway does with a dial: log it in; refuse it (nothing listens); answer
#: `503` with `Retry-After` (the HTTP API over its limits); or never answer (an accept
#: queue that is full drops the SYN).
Answer = Literal["accept", "refuse", "busy", "silent"]


@dataclass(frozen=True)
class Dial:
    at: float
    user_id: int


class SimSession:
    """A logged-in session on the simulated gateway (`session.Session`)."""

    def __init__(self, user_id: int, on_push: PushHandler):
        self.user_id = user_id
        self.alive = True
        self.on_end = None
        self._on_push = on_push
        self._end: asyncio.Future[SessionEnd] = asyncio.get_running_loop().create_future()

    async def request(self, message: wire.ClientMessage, timeout_s: float) -> wire.ReplyMessage:
        if isinstance(message, wire.Ping):
            return wire.Pong(message.client_time_us, 1)
        raise HongbaoError(ErrorKind.UNSUPPORTED, f"the simulated gateway does not answer {message!r}",
                           source=ErrorSource.SERVER)

    async def ended(self) -> SessionEnd:
        return await asyncio.shield(self._end)

    def close(self) -> None:
        self._finish(SessionEnd("closed by the client"))

    async def wait_closed(self) -> None:
        pass

    def kick(self, reason: KickReason, retry_after_ms: int | None = None) -> None:
        """The server's kick, then its close, as the TCP session reports them."""
        kick = wire.Kick(reason, f"kicked: {reason.wire_name}", retry_after_ms)
        self._on_push(kick)
        self._finish(SessionEnd.after_kick(kick))

    def drop(self) -> None:
        """The connection dies without a word (a worker killed, a reset)."""
        self._finish(SessionEnd("reading: [Errno 104] Connection reset by peer"))

    def _finish(self, end: SessionEnd) -> None:
        if not self.alive:
            return
        self.alive = False
        if self.on_end is not None:
            self.on_end(end)
        self._end.set_result(end)


class SimGateway:
    def __init__(self) -> None:
        self.answer: Answer = "accept"
        #: The `Retry-After` of a `busy` answer, in seconds.
        self.retry_after_s = 1.0
        #: How long a dial takes to be answered.
        self.latency_s = 0.001
        self.dials: list[Dial] = []
        self.sessions: list[SimSession] = []

    def live(self) -> list[SimSession]:
        return [s for s in self.sessions if s.alive]

    def dialer(self, user_id: int) -> Dialer:
        async def dial(on_push: PushHandler) -> Session:
            self.dials.append(Dial(asyncio.get_running_loop().time(), user_id))
            answer, retry_after_s = self.answer, self.retry_after_s
            await asyncio.sleep(self.latency_s)
            if answer == "refuse":
                raise ConnectionRefusedError(111, "Connection refused")
            if answer == "busy":
                raise HongbaoError(ErrorKind.CONNECT_FAILED, "GET /v1/me answered 503: over the limit",
                                   source=ErrorSource.SERVER, retry_after_s=retry_after_s)
            if answer == "silent":
                await asyncio.get_running_loop().create_future()  # never answered
            session = SimSession(user_id, on_push)
            self.sessions.append(session)
            return session
        return dial

    def client(self, user_id: int, rng: random.Random, **kwargs: Any) -> Client:
        """A client of `user_id` on this gateway, its back-off the library's default but
        for the random source."""
        backoff = kwargs.pop("backoff", None) or Backoff(rng=rng)
        return Client(self.dialer(user_id), credentials=Credentials("sim-token", user_id=user_id),
                      backoff=backoff, **kwargs)


class Pinned(random.Random):
    """A random source that always draws `value` (just under 1: the top of a window)."""

    def __init__(self, value: float):
        super().__init__(0)
        self.value = value

    def random(self) -> float:  # `uniform` draws through it too
        return self.value


def busiest_bucket(times: list[float], start: float, width_s: float) -> int:
    """The most of `times` in one `width_s` bucket counted from `start`."""
    counts: dict[int, int] = {}
    for t in times:
        bucket = int((t - start) // width_s)
        counts[bucket] = counts.get(bucket, 0) + 1
    return max(counts.values(), default=0)

"""The client: one API over both transports, and the rules that keep money moving once.

A `Client` holds one session at a time (`session.py`) and a supervisor task that, when
the session ends, dials the next one (`backoff.py`): after a full-jitter back-off whose
window doubles with every failed attempt (a lost or refused connection, a dial that
timed out), or, where the server said when to come back — a kick's `retry_after_ms`, an
HTTP `Retry-After` — after ½× to 1½× of that, which is not counted as a failure. A login
resets the count. Never after a kick with reason `replaced`, `bad-token`, `expired` or
`revoked`, whatever wait it names, or a refused token: the client is closed for good, as
coming back would only kick the newer login in turn, or fail again (a session that
lapsed had no fresh token to come back with; a revoked user must sign in to the app
again). Nor after a TLS failure no retry mends (an untrusted certificate, a plain URL at
a TLS port: tls.py).

The client's deadlines and back-off waits read its event loop's clock (`loop.time()`,
the one `asyncio.sleep` and `asyncio.timeout` keep), so they share one timeline, and a
test loop whose clock jumps drives them all.

Tokens (`credentials.py`): a session lasts as long as its token. When the server pushes
`refresh`, the client asks the app's `refresh` callback for a fresh token and logs in
again with it on the same connection (the session goes on, nothing is lost); when the
callback gives none, the session lapses (`Kicked(EXPIRED)`). A fresh token the server
took is the one every later login uses.

Requests and reconnects:

- A request made while disconnected waits for the next session, within its timeout.
- A request whose connection drops before its answer has an unknown outcome. A `send`
  (always under an idempotency key) and an `open` (idempotent by nature) are sent again
  on the next session: the ledger answers a repeated key with the first answer and moves
  no money twice; a repeated open is `already-opened` with the same amount. A `shake` or
  a `chat` is not repeated (it would be a second shake, a second message): it fails with
  CONNECTION_LOST.
- `overloaded` shakes hold this client's next shake back for the server's
  `retry_after_ms` (give or take half); `shake_wait_s` tells how long is left.

Pushes become typed events in a bounded queue read by `events()`; a packet's notice is
handed out once however often the server repeats it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from . import events as ev
from . import messages as wire
from .backoff import Backoff, ShakeGate
from .credentials import Credentials
from .errors import ErrorKind, ErrorSource, HongbaoError
from .events import ConnectionChanged, ConnectionState, Event, SeenPackets
from .http_api import HttpSession
from .messages import MAX_RECIPIENTS, PushMessage, valid_idempotency_key
from .results import Chat, Me, Open, Pong, Send, Shake
from .session import Dialer, Session, SessionEnd

T = TypeVar("T")

_END_OF_EVENTS = object()

#: Kicks after which the client must not reconnect: the token is wrong, the user logged
#: in elsewhere (coming back would kick that newer connection in turn), the session's
#: token ended with no fresh one to come back with, or the user's tokens were revoked.
_FINAL_KICKS = (wire.KickReason.BAD_TOKEN, wire.KickReason.REPLACED, wire.KickReason.EXPIRED,
                wire.KickReason.REVOKED)

#: Dialing failures after which the client must not try again: the token is refused, or
#: TLS cannot be agreed (an untrusted certificate, a plain URL at a TLS port).
_FINAL_ERRORS = (ErrorKind.BAD_TOKEN, ErrorKind.TLS)


class Client:
    def __init__(
        self,
        dial: Dialer,
        *,
        credentials: Credentials,
        side_http: Callable[[], Awaitable[HttpSession]] | None = None,
        request_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        backoff: Backoff | None = None,
        shake_gate: ShakeGate | None = None,
        events_capacity: int = 10_000,
        notice_poll_s: float = 2.0,
    ):
        self._credentials = credentials
        self._dial = dial
        self._side_http_factory = side_http
        self._side_http: HttpSession | None = None
        self._side_http_lock = asyncio.Lock()
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._backoff = backoff or Backoff()
        self._shake_gate = shake_gate or ShakeGate()
        self._notice_poll_s = notice_poll_s
        self._session: Session | None = None
        # Set while a live session is installed, and for good once closed (waiters then
        # find the client closed): requests wait on it while disconnected.
        self._connected = asyncio.Event()
        self._closed: HongbaoError | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._events: asyncio.Queue[object] = asyncio.Queue(maxsize=events_capacity)
        self._watching_notices = False
        self._seen_packets = SeenPackets()
        # Pushes that come with a login (the notices of waiting packets) arrive before
        # the session is installed; they are held so that CONNECTED is told first.
        self._pushes_before_install: list[PushMessage] | None = None
        #: Events dropped because nobody read `events()` fast enough (oldest first).
        self.events_dropped = 0
        #: Sessions dialed after the first.
        self.reconnects = 0
        self.state = ConnectionState.DISCONNECTED

    # -- life cycle -------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, *, retry_refused: bool = True) -> None:
        """Connects and logs in, retrying with back-off for up to `connect_timeout_s`.
        Raises HongbaoError BAD_TOKEN at once if the server refuses the credentials, TLS
        at once if TLS cannot be agreed (an untrusted certificate, a plain URL at a TLS
        port), and
        CONNECT_FAILED at once on a refused connection (nothing listens there) unless
        `retry_refused`: an app may wait for a server that is starting, a command line
        should not wait out the timeout for a mistyped address."""
        deadline = _now() + self.connect_timeout_s
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - _now())):
                    session = await self._dial_session()
                break
            except HongbaoError as e:
                if e.kind in _FINAL_ERRORS:
                    self._close_for_good(str(e), error=e)
                    raise
                failure: BaseException = e
                server_wait_s, limit_s = e.retry_after_s, _limit_wait_s(e)
            except (OSError, TimeoutError) as e:
                failure, server_wait_s, limit_s = e, None, None
            if not retry_refused and _refused(failure):
                raise HongbaoError(ErrorKind.CONNECT_FAILED, f"user {self.user_id} could not connect: {failure}",
                                   source=ErrorSource.NETWORK) from failure
            delay = self._backoff.next_delay(server_wait_s, at_least_s=limit_s)
            if _now() + delay >= deadline:
                raise HongbaoError(ErrorKind.CONNECT_FAILED, f"user {self.user_id} could not connect within "
                                   f"{self.connect_timeout_s:.1f} s: {failure}",
                                   source=ErrorSource.NETWORK) from failure
            await asyncio.sleep(delay)
        self._install(session)
        self._supervisor = asyncio.create_task(self._maintain(), name="hongbao-client-supervisor")

    async def close(self) -> None:
        """Closes the session and ends `events()`. Pending requests fail with CLOSED."""
        if self._closed is None:
            self._close_for_good("closed by the caller")
        if self._supervisor is not None and self._supervisor is not asyncio.current_task():
            self._supervisor.cancel()
            try:
                await self._supervisor
            except (asyncio.CancelledError, Exception):
                pass
        for session in (self._session, self._side_http):
            if session is not None:
                await session.wait_closed()

    @property
    def local_address(self) -> tuple[str, int] | None:
        """This end of the current TCP connection; None over HTTP or while disconnected."""
        session = self._session
        if session is None or not session.alive:
            return None
        return getattr(session, "local_address", None)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def user_id(self) -> int:
        """The user: as given to `connect`, else the token's, as the server named it at
        login (0 before the first login when neither the caller nor the token said)."""
        return self._credentials.user_id

    @property
    def token(self) -> str:
        """The token the next login (or HTTP request) uses."""
        return self._credentials.token

    async def set_token(self, token: str) -> None:
        """Swaps in a fresh token now, without waiting for the server's `refresh`. Over
        TCP the client logs in again with it on the live connection (raises HongbaoError
        BAD_TOKEN if the server refuses it: the session keeps its old token); over HTTP
        the next requests carry it. Either way later logins use it."""
        if self._closed is not None:
            raise self._closed_error(None)
        session = self._session
        if session is None or not session.alive or isinstance(session, HttpSession):
            self._credentials.adopt(token)
            return
        reply = await session.request(self._login(token), self.request_timeout_s)
        if isinstance(reply, wire.LoginReply) and reply.result is wire.ResultCode.OK:
            self._credentials.adopt(token)
            return
        refused = isinstance(reply, (wire.LoginReply, wire.Error)) and reply.result is wire.ResultCode.BAD_TOKEN
        kind = ErrorKind.BAD_TOKEN if refused else ErrorKind.PROTOCOL
        raise HongbaoError(kind, f"the fresh token of user {self.user_id} was answered {reply!r}; the session "
                           "keeps its old one", source=ErrorSource.SERVER)

    # -- requests ---------------------------------------------------------------------

    async def shake(self) -> Shake:
        """Tries to win a share of the running shake campaign. After an `overloaded`
        answer the next shake first waits as long as the server asked (give or take half);
        after a `rate-limited` one, exactly as long."""
        if (hold_s := self._shake_gate.wait_s()) > 0:
            await asyncio.sleep(hold_s)
        reply = _expect(await self._request(wire.Shake(), replay_safe=False), wire.ShakeReply)
        shake = Shake.from_reply(reply)
        if shake.result is wire.ResultCode.OVERLOADED:
            self._shake_gate.overloaded(shake.retry_after_ms)
        elif shake.result is wire.ResultCode.RATE_LIMITED:
            self._shake_gate.rate_limited(shake.retry_after_ms)
        return shake

    @property
    def shake_wait_s(self) -> float:
        """Seconds until the server lets this user shake again (0: now)."""
        return self._shake_gate.wait_s()

    async def send(self, *, amount_cents: int, shares: int, recipients: list[int] | tuple[int, ...],
                   idempotency_key: str | None = None) -> Send:
        """Sends `amount_cents` from my balance in `shares` shares for `recipients`.

        Always under an idempotency key (a fresh UUID unless given): the client resends it
        under that key after a reconnect, and a caller that got a TIMEOUT can call again
        with `error.idempotency_key`; either way the money moves once.
        """
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        if not valid_idempotency_key(key):
            raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"idempotency key {key!r} is not 1 to 64 characters "
                               "of printable ASCII", source=ErrorSource.CLIENT)
        if len(recipients) > MAX_RECIPIENTS:
            raise HongbaoError(ErrorKind.INVALID_ARGUMENT, f"{len(recipients)} recipients, at most {MAX_RECIPIENTS}",
                               source=ErrorSource.CLIENT)
        message = wire.Send(amount_cents, shares, tuple(recipients), key)
        reply = _expect(await self._request(message, replay_safe=True, idempotency_key=key), wire.SendReply)
        return Send.from_reply(reply, key)

    async def open(self, packet_id: int) -> Open:
        """Opens (拆) my share of a packet. Safe to repeat: `already-opened`, same amount."""
        reply = _expect(await self._request(wire.Open(packet_id), replay_safe=True), wire.OpenReply)
        return Open.from_reply(reply, packet_id)

    async def chat(self, to: int, text: str) -> Chat:
        """Routes `text` to user `to`'s connection (`delivered` or `offline`)."""
        reply = _expect(await self._request(wire.Chat(to, text), replay_safe=False), wire.ChatReply)
        return Chat.from_reply(reply)

    async def ping(self) -> Pong:
        sent_us = time.time_ns() // 1000
        started = time.monotonic()
        reply = _expect(await self._request(wire.Ping(sent_us), replay_safe=True), wire.Pong)
        if isinstance(reply, wire.Error):
            raise HongbaoError(ErrorKind.PROTOCOL, f"ping refused: {reply.text}", source=ErrorSource.SERVER)
        return Pong(reply.client_time_us, reply.server_time_us, int((time.monotonic() - started) * 1e6))

    async def me(self) -> Me:
        """My committed balance and newest ledger events. The binary protocol has no such
        request: over TCP this goes to the HTTP API, so `connect(..., http_url=...)`."""
        if self._closed is not None:
            raise self._closed_error(None)
        http = await self._http_for_me()

        async def attempt(_: Session | None, remaining_s: float) -> Me:
            return await http.me(remaining_s)

        return await self._with_retries(attempt, replay_safe=True, needs_session=False)

    # -- pushes -----------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """Pushes and connection changes, in order, until the client is closed.

        One reader at a time. Over HTTP, asking for events starts polling the notices."""
        self._watching_notices = True
        if isinstance(self._session, HttpSession):
            self._session.watch_notices(self._notice_poll_s)
        while True:
            event = await self._events.get()
            if event is _END_OF_EVENTS:
                self._events.put_nowait(_END_OF_EVENTS)  # for a later reader too
                return
            yield event  # type: ignore[misc]

    def _on_push(self, message: PushMessage) -> None:
        if self._pushes_before_install is not None:
            self._pushes_before_install.append(message)
            return
        match message:
            case wire.PacketNotice():
                if self._seen_packets.first_time(message.packet_id):
                    self._emit(ev.PacketNotice(message.packet_id, message.from_user or None, message.amount_cents,
                                               message.shares, message.expires_at_ms))
            case wire.ChatMessage():
                self._emit(ev.ChatMessage(message.from_user, message.text))
            case wire.Broadcast():
                self._emit(ev.Broadcast(message.server_time_us, message.text))
            case wire.Kick():
                self._emit(ev.Kicked(message.reason, message.text, message.retry_after_ms))
            case wire.Refresh():
                self._emit(ev.RefreshRequested(message.expires_at_ms))
                if self._session is not None and (self._refreshing is None or self._refreshing.done()):
                    self._refreshing = asyncio.create_task(self._refresh(self._session),
                                                           name="hongbao-client-refresh")

    async def _refresh(self, session: Session) -> None:
        """Answers the server's `refresh`: a fresh token from the app, and a login with it
        on the same connection. Without one the session lapses at its token's end, and
        the kick `expired` ends the client (its close cause says why no token came)."""
        fresh = await self._credentials.ask()
        if fresh is None or not session.alive:
            return
        try:
            reply = await session.request(self._login(fresh), self.request_timeout_s)
        except HongbaoError as e:
            self._credentials.last_failure = f"logging in with the fresh token: {e}"
            return
        if isinstance(reply, wire.LoginReply) and reply.result is wire.ResultCode.OK:
            self._credentials.adopt(fresh)
        else:
            # The server keeps the session's old token until it ends.
            self._credentials.last_failure = f"the fresh token was answered {reply!r}"

    def _login(self, token: str) -> wire.Login:
        """A login with `token` on a logged-in connection: the same user as before (or
        0, whoever the token names), which the server takes as a refresh."""
        return wire.Login(self._credentials.login_user, token.encode("utf-8"))

    def _emit(self, event: object) -> None:
        # Bounded: a caller that never reads events costs at most `events_capacity`;
        # past it the oldest go (notices come again at the next login).
        while self._events.full():
            self._events.get_nowait()
            self.events_dropped += 1
        self._events.put_nowait(event)

    # -- sessions ---------------------------------------------------------------------

    def _install(self, session: Session) -> None:
        session.on_end = self._session_ended
        if named := getattr(session, "user_id", 0):
            self._credentials.user_id = named
        self._session = session
        # Logged in: the trouble before is over (gRPC's rule), and the next failure starts
        # from the first window.
        self._backoff.reset()
        if self._watching_notices and isinstance(session, HttpSession):
            session.watch_notices(self._notice_poll_s)
        if session.alive:
            self.state = ConnectionState.CONNECTED
            self._connected.set()
            self._emit(ConnectionChanged(ConnectionState.CONNECTED))
        early, self._pushes_before_install = self._pushes_before_install or [], None
        for message in early:
            self._on_push(message)

    async def _dial_session(self) -> Session:
        self._pushes_before_install = []
        try:
            # The dialer logs in with `credentials.for_login()`: a fresh token first when
            # the one it has has ended (a reconnect long after the last refresh).
            return await self._dial(self._on_push)
        except BaseException:
            self._pushes_before_install = None
            raise

    def _session_ended(self, end: SessionEnd) -> None:
        # Synchronous, before the session fails its pending requests: their retries
        # must find no live session and wait for the next one.
        if self._closed is None:
            self._connected.clear()

    async def _maintain(self) -> None:
        """Redials whenever the session ends, until the client is closed."""
        while self._closed is None:
            assert self._session is not None
            end = await self._session.ended()
            if self._closed is not None:
                return
            if end.kick in _FINAL_KICKS:
                cause = end.cause
                if end.kick is wire.KickReason.EXPIRED and self._credentials.last_failure:
                    cause += f" ({self._credentials.last_failure})"
                elif end.kick is wire.KickReason.EXPIRED and not self._credentials.can_refresh:
                    cause += " (no refresh callback was given to connect)"
                self._close_for_good(cause, kick=end.kick)
                return
            session = await self._redial(end)
            if session is None:
                return
            self.reconnects += 1
            self._install(session)

    async def _redial(self, end: SessionEnd) -> Session | None:
        # A kick that names when to come back (a server draining on a restart) is the
        # first wait's hint; a refused dial's `Retry-After` is the next one's.
        cause, server_wait_s, limit_s = end.cause, end.server_wait_s, None
        while self._closed is None:
            delay = self._backoff.next_delay(server_wait_s, at_least_s=limit_s)
            self.state = ConnectionState.DISCONNECTED
            self._emit(ConnectionChanged(ConnectionState.DISCONNECTED, cause, retry_in_s=delay, kick=end.kick))
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    session = await self._dial_session()
            except HongbaoError as e:
                if e.kind in _FINAL_ERRORS:
                    self._close_for_good(str(e), error=e)
                    return None
                cause, server_wait_s, limit_s = str(e), e.retry_after_s, _limit_wait_s(e)
                continue
            except (OSError, TimeoutError) as e:
                # Refused, reset, or not answered within `connect_timeout_s` (a server
                # whose accept queue is full drops the SYN): a failed attempt.
                cause, server_wait_s, limit_s = f"reconnecting: {e!r}", None, None
                continue
            if self._closed is None:
                return session
            self._pushes_before_install = None
            session.close()  # closed while we dialed
            return None
        return None

    def _close_for_good(self, cause: str, *, kick: wire.KickReason | None = None,
                        error: HongbaoError | None = None) -> None:
        if self._closed is not None:
            return
        self._closed = error or HongbaoError(ErrorKind.CLOSED, f"the client of user {self.user_id} is closed: {cause}",
                                             source=ErrorSource.CLIENT if kick is None else ErrorSource.SERVER,
                                             kick=kick)
        self.state = ConnectionState.CLOSED
        self._connected.set()  # wakes waiting requests, which now find the client closed
        if self._refreshing is not None:
            self._refreshing.cancel()
        self._credentials.close()
        if self._session is not None:
            self._session.close()
        if self._side_http is not None:
            self._side_http.close()
        self._emit(ConnectionChanged(ConnectionState.CLOSED, cause, kick=kick))
        self._emit(_END_OF_EVENTS)

    async def _http_for_me(self) -> HttpSession:
        if isinstance(self._session, HttpSession):
            return self._session
        if self._side_http_factory is None:
            raise HongbaoError(ErrorKind.UNSUPPORTED, "me() over TCP needs the HTTP API: "
                               "connect(..., http_url='http://host:port')", source=ErrorSource.CLIENT)
        async with self._side_http_lock:  # one side session, however many me() at once
            if self._side_http is None:
                self._side_http = await self._side_http_factory()
        return self._side_http

    # -- the request loop -------------------------------------------------------------

    async def _request(self, message: wire.ClientMessage, *, replay_safe: bool,
                       idempotency_key: str | None = None) -> wire.ReplyMessage:
        async def attempt(session: Session | None, remaining_s: float) -> wire.ReplyMessage:
            assert session is not None
            return await session.request(message, remaining_s)

        return await self._with_retries(attempt, replay_safe=replay_safe, idempotency_key=idempotency_key)

    async def _with_retries(self, attempt: Callable[[Session | None, float], Awaitable[T]], *, replay_safe: bool,
                            needs_session: bool = True, idempotency_key: str | None = None) -> T:
        """Runs `attempt` on a live session until it answers, the deadline passes, or it
        fails in a way a retry cannot fix."""
        deadline = _now() + self.request_timeout_s
        retry = Backoff(base_s=0.05, cap_s=2.0)
        while True:
            session: Session | None = None
            try:
                if needs_session:
                    session = await self._live_session(deadline)
                return await attempt(session, max(0.001, deadline - _now()))
            except HongbaoError as e:
                if e.kind is ErrorKind.BAD_TOKEN:
                    self._close_for_good(str(e), error=e)
                    raise
                if e.kind is ErrorKind.TLS:
                    # Over HTTP no request would get through; a TCP client's me() fails alone.
                    if isinstance(self._session, HttpSession):
                        self._close_for_good(str(e), error=e)
                    e.idempotency_key = idempotency_key
                    raise
                if e.kind is ErrorKind.TIMEOUT:
                    e.idempotency_key = idempotency_key
                    raise
                not_sent = e.kind is ErrorKind.CONNECT_FAILED
                if not (not_sent or (e.kind is ErrorKind.CONNECTION_LOST and replay_safe)):
                    e.idempotency_key = idempotency_key
                    raise
                if self._closed is not None:
                    raise self._closed_error(idempotency_key) from e
                # Over TCP the dead session is gone and the next one is awaited above;
                # over HTTP the session lives on, so pause before trying again.
                if not needs_session or (session is not None and session.alive):
                    pause = min(retry.next_delay(e.retry_after_s, at_least_s=_limit_wait_s(e)),
                                deadline - _now())
                    if pause <= 0:
                        raise self._timeout(idempotency_key) from e
                    await asyncio.sleep(pause)

    async def _live_session(self, deadline: float) -> Session:
        while True:
            if self._closed is not None:
                raise self._closed_error(None)
            session = self._session
            if session is not None and session.alive and self._connected.is_set():
                return session
            try:
                async with asyncio.timeout(max(0.0, deadline - _now())):
                    await self._connected.wait()
            except TimeoutError:
                raise self._timeout(None) from None
            # A session installed and lost again before we ran: yield, then look again.
            await asyncio.sleep(0)

    def _closed_error(self, idempotency_key: str | None) -> HongbaoError:
        assert self._closed is not None
        closed = self._closed
        return HongbaoError(closed.kind, str(closed), source=closed.source, kick=closed.kick,
                            idempotency_key=idempotency_key)

    def _timeout(self, idempotency_key: str | None) -> HongbaoError:
        return HongbaoError(ErrorKind.TIMEOUT, f"user {self.user_id}: no answer within {self.request_timeout_s:.1f} s "
                            f"(state {self.state.value})", source=ErrorSource.NETWORK, idempotency_key=idempotency_key)


R = TypeVar("R", bound=wire.ReplyMessage)


def _now() -> float:
    """The event loop's clock, in seconds: the one its sleeps and timeouts keep."""
    return asyncio.get_running_loop().time()


def _expect(reply: wire.ReplyMessage, kind: type[R]) -> R | wire.Error:
    """The reply if it is of the kind the request gets (or a refusal); a server that
    answers a shake with an open-reply is not one this client can talk to."""
    if isinstance(reply, (kind, wire.Error)):
        return reply
    raise HongbaoError(ErrorKind.PROTOCOL, f"expected a {kind.__name__}, got {reply!r}", source=ErrorSource.SERVER)


def _limit_wait_s(error: HongbaoError) -> float | None:
    """The wait a per-user limit named (a `rate-limited` login or read): waited out whole."""
    return error.retry_after_s if error.rate_limited else None


def _refused(failure: BaseException) -> bool:
    """A connection the peer refused (over HTTP, wrapped in CONNECT_FAILED)."""
    return isinstance(failure, ConnectionRefusedError) or isinstance(failure.__cause__, ConnectionRefusedError)

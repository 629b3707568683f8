"""The client's own rules, against a scripted server (fake_server.py): replies matched by
request id, sends retried under their key after a reconnect, a kick's wait followed, no
reconnect after `replaced` or `bad-token`, shakes held back after `overloaded`, notices
handed out once; the back-off's arithmetic (test_reconnect.py runs it on a simulated clock).
The live server tests (test_live_server.py) check the same flows end to end."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import random
import time
import unittest

from fake_server import CLOSE, Conn, FakeServer
from sim import Pinned

import hongbao_client as hb
from hongbao_client import messages as m
from hongbao_client.backoff import Backoff, ShakeGate
from hongbao_client.messages import Frame, KickReason, ResultCode


def client(server: FakeServer, **kwargs: object) -> hb.Client:
    # Fast, seeded back-off so the tests are quick and repeatable.
    kwargs.setdefault("backoff", Backoff(base_s=0.02, cap_s=0.2, rng=random.Random(1)))
    kwargs.setdefault("user_id", 7)
    if "token" not in kwargs:
        kwargs.setdefault("secret", "test-secret")
    return hb.connect(server.url, **kwargs)  # type: ignore[arg-type]


async def next_event(c: hb.Client, kind: type, timeout_s: float = 5.0) -> object:
    async with asyncio.timeout(timeout_s):
        async for event in c.events():
            if isinstance(event, kind):
                return event
    raise AssertionError(f"events ended before a {kind.__name__}")


async def collect(c: hb.Client, seconds: float) -> list[object]:
    """Every event that comes within `seconds`."""
    got: list[object] = []
    try:
        async with asyncio.timeout(seconds):
            async for event in c.events():
                got.append(event)
    except TimeoutError:
        pass
    return got


#: golden.txt's login token, less its (made-up) signature: the header and claims a
#: minter writes for user 42, issued at 1,800,000,000 for an hour.
GOLDEN_SIGNING_INPUT = ("eyJhbGciOiJIUzI1NiIsImtpZCI6ImhvbmdiYW8iLCJ0eXAiOiJKV1QifQ"
                        ".eyJzdWIiOiI0MiIsImV4cCI6MTgwMDAwMzYwMCwiaWF0IjoxODAwMDAwMDAwfQ")


def b64url_json(part: str) -> object:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


class Token(unittest.TestCase):
    def test_the_golden_login_token_header_and_claims(self) -> None:
        token = hb.make_token(hb.DEV_SECRET, 42, now=1_800_000_000)
        self.assertEqual(token.rsplit(".", 1)[0], GOLDEN_SIGNING_INPUT)
        # The signature, as `openssl dgst -sha256 -hmac hongbao-dev-secret` makes it
        # (base64url, no padding); the TypeScript suite pins the same token.
        self.assertEqual(token.rsplit(".", 1)[1], "q_oSwQVlYQsKlNWFypNI9SvATV5SlMzQyDliLrgFenw")

    def test_hs256_over_header_dot_claims_base64url_without_padding(self) -> None:
        token = hb.make_token(b"k", 2**64 - 1, ttl_s=60, now=1_700_000_000, kid="app-2", audience="hongbao")
        header, claims, signature = token.split(".")
        self.assertEqual(b64url_json(header), {"alg": "HS256", "kid": "app-2", "typ": "JWT"})
        self.assertEqual(b64url_json(claims), {"sub": "18446744073709551615", "exp": 1_700_000_060,
                                               "iat": 1_700_000_000, "aud": "hongbao"})
        expected = hmac.new(b"k", f"{header}.{claims}".encode(), hashlib.sha256).digest()
        self.assertEqual(base64.urlsafe_b64decode(signature + "="), expected)
        self.assertNotIn("=", token)
        self.assertTrue(token.isascii())

    def test_claims_are_read_without_the_key(self) -> None:
        token = hb.make_token("secret", 42, ttl_s=600, now=1_800_000_000)
        self.assertEqual(hb.token_user(token), 42)
        self.assertEqual(hb.token_expiry_s(token), 1_800_000_600)
        # The old HMAC token (hex) and other non-JWTs: nothing to read, no user, no end.
        for not_a_jwt in ("", "abc", "a.b.c", "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70"):
            self.assertIsNone(hb.claims(not_a_jwt), not_a_jwt)
            self.assertIsNone(hb.token_user(not_a_jwt), not_a_jwt)
            self.assertIsNone(hb.token_expiry_s(not_a_jwt), not_a_jwt)

    def test_user_zero_has_no_token(self) -> None:
        with self.assertRaises(ValueError):
            hb.make_token("s", 0)


class Backoffs(unittest.TestCase):
    def test_full_jitter_over_a_window_doubling_to_the_cap(self) -> None:
        b = Backoff(base_s=0.5, cap_s=30.0, rng=random.Random(3))
        for attempt in range(12):
            window = min(30.0, 0.5 * 2.0**attempt)
            self.assertEqual(b.window_s(), window)
            self.assertTrue(0.0 <= b.next_delay() < window)
        self.assertEqual(b.attempt, 12)
        b.reset()
        self.assertEqual((b.attempt, b.window_s()), (0, 0.5))
        # The window's two ends: a draw of 0 comes back at once, one just under 1 at its end.
        self.assertEqual(Backoff(rng=Pinned(0.0)).next_delay(), 0.0)
        self.assertAlmostEqual(Backoff(rng=Pinned(0.999999)).next_delay(), 0.5, places=5)

    def test_a_server_wait_is_drawn_from_half_to_one_and_a_half_of_it_and_not_counted(self) -> None:
        b = Backoff(base_s=0.1, rng=random.Random(4))
        for _ in range(50):
            self.assertTrue(2.5 <= b.next_delay(server_wait_s=5.0) <= 7.5)
        self.assertEqual(b.attempt, 0)
        self.assertEqual(Backoff(rng=Pinned(0.0)).next_delay(2.5), 1.25)
        self.assertAlmostEqual(Backoff(rng=Pinned(0.999999)).next_delay(2.5), 3.75, places=5)

    def test_a_per_user_limit_is_a_floor(self) -> None:
        self.assertEqual(Backoff(rng=Pinned(0.0)).next_delay(at_least_s=0.9), 0.9)
        self.assertEqual(Backoff(rng=Pinned(0.0)).next_delay(4.0, at_least_s=4.0), 4.0)

    def test_shake_gate_holds_at_least_half_the_wait(self) -> None:
        for seed in range(50):
            gate = ShakeGate(rng=random.Random(seed))
            drawn = gate.overloaded(2000)
            self.assertTrue(1.0 <= drawn <= 3.0)
            self.assertGreater(gate.wait_s(), 0.9)

    def test_no_named_wait_uses_the_default(self) -> None:
        gate = ShakeGate(default_wait_s=30.0, rng=random.Random(5))
        self.assertGreaterEqual(gate.overloaded(None), 15.0)


class Requests(unittest.IsolatedAsyncioTestCase):
    async def test_replies_out_of_order_reach_their_requests(self) -> None:
        held: list[tuple[Conn, Frame]] = []

        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Open):
                held.append((conn, frame))
                if len(held) == 2:  # answer the second first
                    for c, f in reversed(held):
                        assert isinstance(f.message, m.Open)
                        c.push(m.OpenReply(ResultCode.OPENED, f.message.packet_id, f.message.packet_id * 10),
                               f.request_id)
            return None

        async with FakeServer(script) as server, client(server) as c:
            first, second = await asyncio.gather(c.open(1), c.open(2))
        self.assertEqual((first.packet_id, first.amount_cents), (1, 10))
        self.assertEqual((second.packet_id, second.amount_cents), (2, 20))

    async def test_frames_cut_into_single_bytes_are_read_whole(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Shake):
                data = hb.frame.encode(Frame(0, m.ChatMessage(3, "新年快乐"))) + hb.frame.encode(
                    Frame(frame.request_id, m.ShakeReply(ResultCode.WON, 5, 88)))
                for i in range(len(data)):
                    conn.writer.write(data[i:i + 1])
                    await conn.writer.drain()
                    await asyncio.sleep(0)
            return None

        async with FakeServer(script) as server, client(server) as c:
            shake = await c.shake()
            chat = await next_event(c, hb.ChatMessage)
        self.assertEqual(shake, hb.Shake(ResultCode.WON, 5, 88))
        self.assertEqual(chat, hb.ChatMessage(3, "新年快乐"))

    async def test_a_request_without_answer_times_out(self) -> None:
        async with FakeServer() as server, client(server, request_timeout_s=0.3) as c:
            started = time.monotonic()
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.send(amount_cents=10, shares=1, recipients=[8], idempotency_key="order-1")
        self.assertEqual(caught.exception.kind, hb.ErrorKind.TIMEOUT)
        self.assertEqual(caught.exception.idempotency_key, "order-1")
        self.assertGreaterEqual(time.monotonic() - started, 0.3)

    async def test_every_send_carries_a_key(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Send):
                return m.SendReply(ResultCode.OK, 1, 90)
            return None

        async with FakeServer(script) as server, client(server) as c:
            sent = await c.send(amount_cents=10, shares=1, recipients=[8])
        ((_, frame),) = server.frames(m.Send)
        assert isinstance(frame.message, m.Send)
        self.assertIsNotNone(frame.message.idempotency_key)
        self.assertEqual(sent.idempotency_key, frame.message.idempotency_key)

    async def test_an_error_frame_is_a_result_not_a_crash(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Send):
                return m.Error(ResultCode.BAD_REQUEST, "this idempotency key was used for a different send")
            return None

        async with FakeServer(script) as server, client(server) as c:
            sent = await c.send(amount_cents=10, shares=1, recipients=[8], idempotency_key="k")
        self.assertEqual(sent.result, ResultCode.BAD_REQUEST)
        self.assertIn("different send", sent.error or "")


class Reconnects(unittest.IsolatedAsyncioTestCase):
    async def test_a_send_lost_with_its_connection_is_sent_again_with_its_key(self) -> None:
        ledger: dict[str, m.SendReply] = {}
        balance = [1000]

        def script(conn: Conn, frame: Frame) -> object:
            message = frame.message
            if isinstance(message, m.Send):
                assert message.idempotency_key is not None
                if message.idempotency_key not in ledger:
                    balance[0] -= message.amount_cents
                    ledger[message.idempotency_key] = m.SendReply(ResultCode.OK, 77, balance[0])
                if conn.index == 0:
                    return CLOSE  # committed, then the connection died before the answer
                return ledger[message.idempotency_key]
            return None

        async with FakeServer(script) as server, client(server) as c:
            sent = await c.send(amount_cents=300, shares=2, recipients=[8, 9])
            self.assertEqual(c.reconnects, 1)
        self.assertEqual(sent, hb.Send(ResultCode.OK, 77, 700, sent.idempotency_key))
        keys = {f.message.idempotency_key for _, f in server.frames(m.Send)}  # type: ignore[union-attr]
        self.assertEqual(len(server.frames(m.Send)), 2)
        self.assertEqual(keys, {sent.idempotency_key})
        self.assertEqual(balance[0], 700)  # the money moved once

    async def test_a_shake_lost_with_its_connection_is_not_repeated(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            return CLOSE if isinstance(frame.message, m.Shake) else None

        async with FakeServer(script) as server, client(server) as c:
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.shake()
        self.assertEqual(caught.exception.kind, hb.ErrorKind.CONNECTION_LOST)
        self.assertEqual(len(server.frames(m.Shake)), 1)

    async def test_kick_shutdown_reconnects(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login) and conn.index == 0:
                conn.push(m.LoginReply(ResultCode.OK, 7), frame.request_id)
                conn.push(m.Kick(KickReason.SHUTDOWN, "bye"))
                await conn.writer.drain()
                return CLOSE
            if isinstance(frame.message, m.Ping):
                return m.Pong(frame.message.client_time_us, 1)
            return None

        async with FakeServer(script) as server, client(server) as c:
            kicked = await next_event(c, hb.Kicked)
            await c.ping()  # waits for the next session
            self.assertGreaterEqual(c.reconnects, 1)
        self.assertEqual(kicked, hb.Kicked(KickReason.SHUTDOWN, "bye"))
        self.assertEqual(len(server.conns), 2)

    async def test_a_kick_naming_a_wait_is_followed(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login) and conn.index == 0:
                conn.push(m.LoginReply(ResultCode.OK, 7), frame.request_id)
                conn.push(m.Kick(KickReason.SHUTDOWN, "draining", retry_after_ms=300))
                await conn.writer.drain()
                return CLOSE
            if isinstance(frame.message, m.Ping):
                return m.Pong(frame.message.client_time_us, 1)
            return None

        async with FakeServer(script) as server, client(server) as c:  # back-off: 20 ms
            kicked = await next_event(c, hb.Kicked)
            told = await next_event(c, hb.ConnectionChanged)
            await c.ping()  # waits for the next session
        self.assertEqual(kicked, hb.Kicked(KickReason.SHUTDOWN, "draining", 300))
        assert isinstance(told, hb.ConnectionChanged)
        self.assertEqual((told.state, told.kick), (hb.ConnectionState.DISCONNECTED, KickReason.SHUTDOWN))
        self.assertTrue(0.15 <= (told.retry_in_s or 0) <= 0.45)  # 300 ms, give or take half
        (first, _), (second, _) = server.frames(m.Login)
        self.assertGreaterEqual(second - first, 0.15)

    async def test_no_reconnect_after_kick_replaced(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login):
                conn.push(m.LoginReply(ResultCode.OK, 7), frame.request_id)
                conn.push(m.Kick(KickReason.REPLACED, "logged in elsewhere"))
                await conn.writer.drain()
                return CLOSE
            return None

        async with FakeServer(script) as server:
            c = client(server)
            await c.start()
            closed = await next_event(c, hb.ConnectionChanged)
            while closed.state is not hb.ConnectionState.CLOSED:  # type: ignore[attr-defined]
                closed = await next_event(c, hb.ConnectionChanged)
            await asyncio.sleep(0.5)  # room for a wrong reconnect to show
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.shake()
            await c.close()
        self.assertEqual(len(server.conns), 1)
        self.assertEqual(caught.exception.kind, hb.ErrorKind.CLOSED)
        self.assertEqual(caught.exception.kick, KickReason.REPLACED)

    async def test_bad_token_fails_at_once_and_is_not_retried(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login):
                return [m.LoginReply(ResultCode.BAD_TOKEN, 7), m.Kick(KickReason.BAD_TOKEN, "bad token")]
            return None

        async with FakeServer(script) as server:
            with self.assertRaises(hb.HongbaoError) as caught:
                async with client(server):
                    pass
            await asyncio.sleep(0.3)
        self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
        self.assertEqual(len(server.conns), 1)


class Overload(unittest.IsolatedAsyncioTestCase):
    async def test_the_next_shake_waits_for_the_server(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Shake):
                if len(server.frames(m.Shake)) == 1:
                    return m.ShakeReply(ResultCode.OVERLOADED, 0, 0, retry_after_ms=400)
                return m.ShakeReply(ResultCode.NOTHING, 0, 0)
            return None

        async with FakeServer(script) as server, client(server) as c:
            first = await c.shake()
            answered = time.monotonic()
            self.assertGreater(c.shake_wait_s, 0.19)
            second = await c.shake()
        (_, _), (second_sent, _) = server.frames(m.Shake)
        self.assertEqual(first.result, ResultCode.OVERLOADED)
        self.assertEqual(first.retry_after_ms, 400)
        self.assertEqual(second.result, ResultCode.NOTHING)
        self.assertGreaterEqual(second_sent - answered, 0.2)  # at least half the wait asked


class Tokens(unittest.IsolatedAsyncioTestCase):
    """The session's token: logins with a JWT, the server's `refresh` answered through the
    app's callback on the same connection, a lapse, a revocation."""

    async def test_a_token_alone_logs_in_as_whoever_it_names(self) -> None:
        token = hb.make_token("s", 42)
        async with FakeServer() as server, hb.connect(server.url, token=token) as c:
            self.assertEqual(c.user_id, 42)  # the token's sub, then the login reply's
        ((_, frame),) = server.frames(m.Login)
        self.assertEqual(frame.message, m.Login(0, token.encode()))

    async def test_a_refresh_logs_in_again_on_the_same_connection(self) -> None:
        asked: list[int] = []

        async def fresh(user_id: int) -> str:
            asked.append(user_id)
            await asyncio.sleep(0.01)  # an app server's round trip
            return f"fresh.{len(asked)}.token"

        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Ping):
                return [m.Refresh(1_800_000_060_000), m.Pong(frame.message.client_time_us, 1)]
            return None

        async with FakeServer(script) as server, hb.connect(server.url, token="first.jwt.x", user_id=7,
                                                            refresh=fresh) as c:
            await c.ping()
            told = await next_event(c, hb.RefreshRequested)
            # The fresh token is the client's once the server's answer to its login is back.
            for _ in range(200):
                if len(server.frames(m.Login)) == 2 and c.token != "first.jwt.x":
                    break
                await asyncio.sleep(0.01)
            self.assertEqual(c.token, "fresh.1.token")
        self.assertEqual(told, hb.RefreshRequested(1_800_000_060_000))
        self.assertEqual(asked, [7])
        logins = [(f.message.user_id, f.message.token) for _, f in server.frames(m.Login)]  # type: ignore[union-attr]
        self.assertEqual(logins, [(7, b"first.jwt.x"), (7, b"fresh.1.token")])
        self.assertEqual(len(server.conns), 1)  # no reconnect
        self.assertEqual(c.reconnects, 0)

    async def test_a_reconnect_logs_in_with_the_fresh_token(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login) and frame.message.token == b"first.jwt.x":
                return [m.LoginReply(ResultCode.OK, 7), m.Refresh(1)]
            if isinstance(frame.message, m.Ping) and conn.index == 0:
                return CLOSE
            if isinstance(frame.message, m.Ping):
                return m.Pong(frame.message.client_time_us, 1)
            return None

        async with FakeServer(script) as server, client(server, token="first.jwt.x",
                                                        refresh=lambda user: "fresh.jwt.x") as c:
            for _ in range(100):
                if c.token == "fresh.jwt.x":
                    break
                await asyncio.sleep(0.01)
            await c.ping()  # lost with its connection, and sent again on the next
        tokens = [(i, f.message.token) for i, conn in enumerate(server.conns)  # type: ignore[union-attr]
                  for _, f in conn.received if isinstance(f.message, m.Login)]
        self.assertEqual(tokens, [(0, b"first.jwt.x"), (0, b"fresh.jwt.x"), (1, b"fresh.jwt.x")])

    async def test_a_token_that_ended_is_refreshed_before_a_login(self) -> None:
        # A reconnect long after the last refresh (here, a token given when it had ended):
        # the client asks for a fresh one before it dials, and logs in with that.
        old = hb.make_token("s", 7, ttl_s=30, now=int(time.time()) - 60)

        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Ping) and conn.index == 0:
                return CLOSE
            if isinstance(frame.message, m.Ping):
                return m.Pong(frame.message.client_time_us, 1)
            return None

        async with FakeServer(script) as server, client(server, token=old,
                                                        refresh=lambda user: f"fresh-for-{user}") as c:
            await c.ping()  # lost with its connection, and sent again on the next
        tokens = [f.message.token for _, f in server.frames(m.Login)]  # type: ignore[union-attr]
        self.assertEqual(tokens, [b"fresh-for-7", b"fresh-for-7"])

    async def test_no_fresh_token_lets_the_session_lapse_for_good(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Ping):
                conn.push(m.Refresh(1))
                await conn.writer.drain()
                await asyncio.sleep(0.1)
                conn.push(m.Kick(KickReason.EXPIRED, "the session's token expired"))
                await conn.writer.drain()
                return CLOSE
            return None

        for refresh in (lambda user: None, None, self._raising):
            async with FakeServer(script) as server:
                c = client(server, token="only.jwt.x", refresh=refresh)
                await c.start()
                with self.assertRaises(hb.HongbaoError):
                    await c.ping()
                events = await collect(c, 0.5)
                await c.close()
            with self.subTest(refresh=refresh):
                self.assertIn(hb.RefreshRequested(1), events)
                self.assertIn(hb.Kicked(KickReason.EXPIRED, "the session's token expired"), events)
                closed = events[-1]
                self.assertEqual((closed.state, closed.kick), (hb.ConnectionState.CLOSED, KickReason.EXPIRED))
                why = {None: "no refresh callback", self._raising: "raised"}.get(refresh, "gave no token")
                self.assertIn(why, closed.cause)
                self.assertEqual(len(server.frames(m.Login)), 1)  # no login without a token
                self.assertEqual(len(server.conns), 1)  # and no reconnect

    @staticmethod
    def _raising(user: int) -> str:
        raise RuntimeError("the app server is down")

    async def test_revoked_closes_for_good(self) -> None:
        async def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Ping):
                conn.push(m.Kick(KickReason.REVOKED, "this user's sessions were revoked"))
                await conn.writer.drain()
                return CLOSE
            return None

        async with FakeServer(script) as server, client(server) as c:
            with self.assertRaises(hb.HongbaoError):
                await c.ping()
            await asyncio.sleep(0.3)
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.ping()
        self.assertEqual((caught.exception.kind, caught.exception.kick), (hb.ErrorKind.CLOSED, KickReason.REVOKED))
        self.assertEqual(len(server.conns), 1)

    async def test_set_token_logs_in_on_the_live_connection(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login) and frame.message.token == b"forged":
                return m.LoginReply(ResultCode.BAD_TOKEN, 7)
            return None

        async with FakeServer(script) as server, client(server) as c:
            # A token that is alive is not refreshed before the login (the server asks).
            ((_, login),) = server.frames(m.Login)
            self.assertEqual(login.message, m.Login(7, c.token.encode()))
            await c.set_token("fresh.jwt.x")
            self.assertEqual(c.token, "fresh.jwt.x")
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.set_token("forged")
            self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
            self.assertEqual(c.token, "fresh.jwt.x")  # the session keeps the token it had
            self.assertFalse(c.closed)
        self.assertEqual(len(server.conns), 1)


class RateLimits(unittest.IsolatedAsyncioTestCase):
    async def test_rate_limited_answers_name_their_wait(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Shake):
                if len(server.frames(m.Shake)) == 1:
                    return m.ShakeReply(ResultCode.RATE_LIMITED, 0, 0, retry_after_ms=300)
                return m.ShakeReply(ResultCode.NOTHING, 0, 0)
            if isinstance(frame.message, m.Send):
                return m.Error(ResultCode.RATE_LIMITED, "over 1 send a second", retry_after_ms=700)
            return None

        async with FakeServer(script) as server, client(server) as c:
            limited = await c.shake()
            answered = time.monotonic()
            self.assertGreater(c.shake_wait_s, 0.25)  # exactly the wait: no jitter below it
            await c.shake()
            sent = await c.send(amount_cents=1, shares=1, recipients=[8], idempotency_key="k")
        (_, _), (second_sent, _) = server.frames(m.Shake)
        self.assertEqual((limited.result, limited.retry_after_ms), (ResultCode.RATE_LIMITED, 300))
        self.assertGreaterEqual(second_sent - answered, 0.29)
        self.assertEqual((sent.result, sent.retry_after_ms, sent.error),
                         (ResultCode.RATE_LIMITED, 700, "over 1 send a second"))


    async def test_a_rate_limited_login_waits_out_the_whole_wait(self) -> None:
        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login) and conn.index == 0:
                return m.Error(ResultCode.RATE_LIMITED, "over this user's limit of logins", retry_after_ms=300)
            return None

        async with FakeServer(script) as server, client(server) as c:  # back-off: 20 ms
            self.assertEqual(c.state, hb.ConnectionState.CONNECTED)
        (first, _), (second, _) = server.frames(m.Login)
        self.assertGreaterEqual(second - first, 0.3)


class Notices(unittest.IsolatedAsyncioTestCase):
    async def test_a_packet_is_handed_out_once(self) -> None:
        notice = m.PacketNotice(77, 42, 1000, 3, 1_700_000_060_000)
        campaign = m.PacketNotice(78, 0, 500, 1, 1_700_000_060_000)

        def script(conn: Conn, frame: Frame) -> object:
            if isinstance(frame.message, m.Login):
                return [m.LoginReply(ResultCode.OK, 7), notice, notice, campaign, notice]
            return None

        async with FakeServer(script) as server, client(server) as c:
            events = await collect(c, 0.5)
            got = [e for e in events if isinstance(e, hb.PacketNotice)]
        # The notices came with the login, and are told after the connection is.
        self.assertEqual(events[0], hb.ConnectionChanged(hb.ConnectionState.CONNECTED))
        self.assertEqual([n.packet_id for n in got], [77, 78])
        self.assertIsNone(got[1].from_user)  # a system campaign's packet


if __name__ == "__main__":
    unittest.main()

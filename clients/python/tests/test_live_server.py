"""The client against a real `hongbao serve`, started here on loopback ports of its own.

The binary is `$HONGBAO_BIN`, else the newest of target/release/hongbao and
target/debug/hongbao; with none the tests are skipped, saying so (CI builds
target/debug/hongbao first). Every flow ends by checking the money audit, and the
class checks it once more before stopping the server.

Logins are JWTs minted here with the server's secret (`make_token`, as an app server
would); `LiveTokens` runs a server whose sessions end within seconds of their token
(`refresh_before_secs = 30`, `token_leeway_secs = 0`), for the refresh, lapse and
revocation flows.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import unittest
from pathlib import Path
from typing import Any, ClassVar

import hongbao_client as hb
from hongbao_client import frame as codec
from hongbao_client import messages as m
from hongbao_client.backoff import Backoff
from hongbao_client.devserver import DevServer, find_binary
from hongbao_client.http1 import HttpPool
from hongbao_client.messages import KickReason, ResultCode

SECRET = "python-client-test-secret"
#: clients/python, where `python3 -m hongbao_client` finds the package.
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
BINARY = find_binary()
NO_BINARY = ("no hongbao binary: set $HONGBAO_BIN or build one (cargo build) so that "
             "target/debug/hongbao or target/release/hongbao exists")


async def next_event(c: hb.Client, match: Any, timeout_s: float = 10.0) -> Any:
    """The first event that is an instance of `match` (a type) or satisfies it (a predicate)."""
    test = (lambda e: isinstance(e, match)) if isinstance(match, type) else match
    async with asyncio.timeout(timeout_s):
        async for event in c.events():
            if test(event):
                return event
    raise AssertionError("events ended")


async def collect(c: hb.Client, seconds: float) -> list[Any]:
    got: list[Any] = []
    try:
        async with asyncio.timeout(seconds):
            async for event in c.events():
                got.append(event)
    except TimeoutError:
        pass
    return got


async def win(c: hb.Client, tries: int = 400) -> hb.Shake:
    """Shakes until a win (the class's campaign releases packets all along)."""
    for _ in range(tries):
        shake = await c.shake()
        if shake.won:
            return shake
        await asyncio.sleep(0.01)
    raise AssertionError(f"no win in {tries} shakes")


class ServerTest(unittest.IsolatedAsyncioTestCase):
    """A server for the class; subclasses say how to start it."""

    server: ClassVar[DevServer]
    extra_args: ClassVar[list[str]] = []
    workers: ClassVar[int] = 2
    config: ClassVar[str | None] = None

    @classmethod
    def setUpClass(cls) -> None:
        if BINARY is None:
            raise unittest.SkipTest(NO_BINARY)
        cls.server = DevServer(BINARY, extra_args=cls.extra_args, workers=cls.workers, secret=SECRET,
                               config=cls.config).start()

    @classmethod
    def tearDownClass(cls) -> None:
        try:
            audit = asyncio.run(cls.server.audit())
            assert audit["ok"], f"money audit failed: {audit}"
        finally:
            cls.server.stop()

    async def asyncSetUp(self) -> None:
        # Some steps read /proc synchronously (finding a worker); asyncio's debug mode,
        # which the test case turns on, would report that as a slow callback.
        asyncio.get_running_loop().slow_callback_duration = 1.0

    def tcp(self, user_id: int, **kwargs: Any) -> hb.Client:
        kwargs.setdefault("http_url", self.server.http_url)
        kwargs.setdefault("secret", SECRET)
        return hb.connect(self.server.tcp_url, user_id=user_id, **kwargs)

    def http(self, user_id: int, **kwargs: Any) -> hb.Client:
        kwargs.setdefault("secret", SECRET)
        kwargs.setdefault("notice_poll_s", 0.2)
        return hb.connect(self.server.http_url, user_id=user_id, **kwargs)

    async def assert_audit_ok(self) -> None:
        audit = await self.server.audit()
        self.assertTrue(audit["ok"], audit)


@unittest.skipIf(BINARY is None, NO_BINARY)
class LiveFlows(ServerTest):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        asyncio.run(cls.server.start_shake_campaign(packets=1_000_000, rate_per_sec=500))

    async def test_login_ping_and_bad_token(self) -> None:
        async with self.tcp(101) as c:
            self.assertEqual(c.state, hb.ConnectionState.CONNECTED)
            pong = await c.ping()
            self.assertGreater(pong.server_time_us, 0)
        started = time.monotonic()
        with self.assertRaises(hb.HongbaoError) as caught:
            async with hb.connect(self.server.tcp_url, user_id=102, secret="not-the-secret"):
                pass
        self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
        self.assertLess(time.monotonic() - started, 3.0)  # refused at once, not retried
        with self.assertRaises(hb.HongbaoError) as caught:
            async with hb.connect(self.server.http_url, user_id=102, secret="not-the-secret"):
                pass
        self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
        await self.assert_audit_ok()

    async def test_shake_until_a_win(self) -> None:
        async with self.tcp(111) as c:
            won = await win(c)
            self.assertIsNotNone(won.packet_id)
            self.assertGreaterEqual(won.amount_cents, 100)
            me = await c.me()
            self.assertEqual(me.user_id, 111)
            self.assertGreaterEqual(me.balance_cents, won.amount_cents)
            self.assertEqual(me.recent_events[0]["kind"], "shake_won")
        await self.assert_audit_ok()

    async def test_send_with_a_key_and_its_retry_moves_money_once(self) -> None:
        async with self.tcp(121) as c:
            await win(c)
            before = (await c.me()).balance_cents
            first = await c.send(amount_cents=50, shares=2, recipients=[122, 123], idempotency_key="py-order-121-1")
            again = await c.send(amount_cents=50, shares=2, recipients=[122, 123], idempotency_key="py-order-121-1")
            self.assertEqual(first.result, ResultCode.OK)
            self.assertEqual(again, first)
            self.assertEqual(first.balance_cents, before - 50)
            self.assertEqual((await c.me()).balance_cents, before - 50)
            # The same key for a different send is refused, and moves nothing.
            other = await c.send(amount_cents=60, shares=2, recipients=[122, 123], idempotency_key="py-order-121-1")
            self.assertEqual(other.result, ResultCode.BAD_REQUEST)
            self.assertIn("different send", other.error or "")
            # A fresh key per call unless given: two sends, two packets.
            a = await c.send(amount_cents=5, shares=1, recipients=[122])
            b = await c.send(amount_cents=5, shares=1, recipients=[122])
            self.assertNotEqual(a.packet_id, b.packet_id)
            self.assertEqual((await c.me()).balance_cents, before - 60)
            too_much = await c.send(amount_cents=10**9, shares=1, recipients=[122])
            self.assertEqual(too_much.result, ResultCode.INSUFFICIENT_FUNDS)
            self.assertEqual(too_much.balance_cents, before - 60)
        await self.assert_audit_ok()

    async def test_open_a_share(self) -> None:
        async with self.tcp(131) as sender, self.tcp(132) as recipient:
            await win(sender)
            sent = await sender.send(amount_cents=30, shares=3, recipients=[132, 133, 134])
            notice = await next_event(recipient, hb.PacketNotice)
            self.assertEqual((notice.packet_id, notice.from_user, notice.amount_cents, notice.shares),
                             (sent.packet_id, 131, 30, 3))
            opened = await recipient.open(notice.packet_id)
            self.assertEqual(opened.result, ResultCode.OPENED)
            self.assertGreaterEqual(opened.amount_cents, 1)
            again = await recipient.open(notice.packet_id)
            self.assertEqual((again.result, again.amount_cents), (ResultCode.ALREADY_OPENED, opened.amount_cents))
            self.assertEqual((await recipient.open(notice.packet_id + 10**9)).result, ResultCode.NO_SUCH_PACKET)
            self.assertEqual((await sender.open(notice.packet_id)).result, ResultCode.NOT_A_RECIPIENT)
        await self.assert_audit_ok()

    async def test_chat_between_two_users(self) -> None:
        async with self.tcp(141) as alice, self.tcp(142) as bob:
            said = await alice.chat(142, "新年快乐 🧧")
            self.assertEqual(said.result, ResultCode.DELIVERED)
            heard = await next_event(bob, hb.ChatMessage)
            self.assertEqual(heard, hb.ChatMessage(141, "新年快乐 🧧"))
            self.assertEqual((await alice.chat(149, "anyone?")).result, ResultCode.OFFLINE)
        await self.assert_audit_ok()

    async def test_a_notice_to_an_offline_user_comes_at_login(self) -> None:
        async with self.tcp(151) as sender:
            await win(sender)
            sent = await sender.send(amount_cents=20, shares=1, recipients=[152])
        async with self.tcp(152) as late:
            notice = await next_event(late, hb.PacketNotice)
            self.assertEqual((notice.packet_id, notice.from_user), (sent.packet_id, 151))
            self.assertEqual((await late.open(notice.packet_id)).amount_cents, 20)
        await self.assert_audit_ok()

    async def test_a_second_login_kicks_the_first_for_good(self) -> None:
        first = self.tcp(161)
        await first.start()
        try:
            async with self.tcp(161) as second:
                kicked = await next_event(first, hb.Kicked)
                self.assertEqual(kicked.reason, KickReason.REPLACED)
                closed = await next_event(first, lambda e: isinstance(e, hb.ConnectionChanged)
                                          and e.state is hb.ConnectionState.CLOSED)
                self.assertEqual(closed.kick, KickReason.REPLACED)
                with self.assertRaises(hb.HongbaoError) as caught:
                    await first.shake()
                self.assertEqual(caught.exception.kind, hb.ErrorKind.CLOSED)
                # The first does not come back and kick the second in turn.
                await asyncio.sleep(1.0)
                self.assertEqual(second.state, hb.ConnectionState.CONNECTED)
                self.assertFalse([e for e in await collect(second, 0.2) if isinstance(e, hb.Kicked)])
                await second.ping()
        finally:
            await first.close()
        await self.assert_audit_ok()

    async def test_reconnect_after_the_worker_is_killed(self) -> None:
        # User 172 has a packet waiting (its notice comes at every login) and money to send.
        async with self.tcp(171) as sender:
            await win(sender)
            waiting = await sender.send(amount_cents=10, shares=1, recipients=[172])
        async with self.http(172) as over_http:
            await win(over_http)
            before = (await over_http.me()).balance_cents
        async with self.tcp(172, backoff=Backoff(base_s=0.1, cap_s=1.0)) as c:
            notice = await next_event(c, hb.PacketNotice)
            self.assertEqual(notice.packet_id, waiting.packet_id)
            address = c.local_address
            assert address is not None
            worker = self.server.worker_holding(address[1])
            self.assertIsNotNone(worker, "no worker holds the client's connection")
            # A send in flight as the worker dies: sent again under its key if need be.
            send = asyncio.create_task(c.send(amount_cents=25, shares=1, recipients=[173]))
            await asyncio.sleep(0)
            os.kill(worker, signal.SIGKILL)  # type: ignore[arg-type]
            await next_event(c, lambda e: isinstance(e, hb.ConnectionChanged)
                             and e.state is hb.ConnectionState.DISCONNECTED)
            await next_event(c, lambda e: isinstance(e, hb.ConnectionChanged)
                             and e.state is hb.ConnectionState.CONNECTED, timeout_s=30)
            sent = await send
            self.assertEqual(sent.result, ResultCode.OK)
            self.assertGreaterEqual(c.reconnects, 1)
            self.assertTrue((await c.ping()).rtt_us > 0)
            shake = await c.shake()
            self.assertIn(shake.result, (ResultCode.WON, ResultCode.NOTHING))
            # The login repeated the waiting packet's notice; the client hands it out once.
            again = [e for e in await collect(c, 1.0) if isinstance(e, hb.PacketNotice)]
            self.assertEqual(again, [])
            repeat = await c.send(amount_cents=25, shares=1, recipients=[173], idempotency_key=sent.idempotency_key)
            self.assertEqual(repeat.packet_id, sent.packet_id)
            # The money moved once, whether the first send or its retry was committed.
            expected = before - 25 + (shake.amount_cents if shake.won else 0)
            self.assertEqual((await c.me()).balance_cents, expected)
        await self.assert_audit_ok()

    async def test_http_runs_the_same_flow(self) -> None:
        async with self.http(181) as sender, self.http(182) as recipient, self.tcp(183) as listener:
            won = await win(sender)
            self.assertGreaterEqual((await sender.me()).balance_cents, won.amount_cents)
            before = (await sender.me()).balance_cents
            first = await sender.send(amount_cents=40, shares=2, recipients=[182, 183], idempotency_key="py-http-181")
            again = await sender.send(amount_cents=40, shares=2, recipients=[182, 183], idempotency_key="py-http-181")
            self.assertEqual(first.result, ResultCode.OK)
            self.assertEqual(again, first)
            self.assertEqual((await sender.me()).balance_cents, before - 40)
            # The HTTP recipient learns of the packet by polling its notices.
            notice = await next_event(recipient, hb.PacketNotice)
            self.assertEqual((notice.packet_id, notice.from_user), (first.packet_id, 181))
            opened = await recipient.open(notice.packet_id)
            self.assertEqual(opened.result, ResultCode.OPENED)
            self.assertEqual((await recipient.open(notice.packet_id)).result, ResultCode.ALREADY_OPENED)
            self.assertEqual((await recipient.me()).balance_cents, opened.amount_cents)
            # Chat from HTTP reaches a connected user.
            self.assertEqual((await sender.chat(183, "from http")).result, ResultCode.DELIVERED)
            self.assertEqual(await next_event(listener, hb.ChatMessage), hb.ChatMessage(181, "from http"))
            self.assertGreater((await sender.ping()).server_time_us, 0)
        await self.assert_audit_ok()


    async def test_the_command_line(self) -> None:
        async def cli(*args: str) -> tuple[int, list[dict[str, Any]]]:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hongbao_client", *args, "--secret", SECRET,
                cwd=PACKAGE_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), 60)
            assert process.returncode is not None
            self.assertIn(process.returncode, (0, 1), err.decode())
            return process.returncode, [json.loads(line) for line in out.decode().splitlines()]

        tcp, http = self.server.tcp_url, self.server.http_url
        status, shakes = await cli("shake", "--server", tcp, "--user", "191", "--until-win")
        self.assertEqual((status, shakes[-1]["result"]), (0, "won"))
        listener = asyncio.create_task(cli("listen", "--server", tcp, "--user", "192", "--seconds", "4"))
        await asyncio.sleep(1.0)  # logged in before the send, so its notice comes as a push
        status, (sent,) = await cli("send", "--server", tcp, "--user", "191", "--amount-cents", "10",
                                    "--shares", "1", "--to", "192", "--key", "py-cli-191")
        self.assertEqual((status, sent["type"], sent["result"]), (0, "Send", "ok"))
        status, (opened,) = await cli("open", "--server", http, "--user", "192", str(sent["packet_id"]))
        self.assertEqual((status, opened["result"], opened["amount_cents"]), (0, "opened", 10))
        status, (me,) = await cli("me", "--server", tcp, "--http", http, "--user", "192")
        self.assertEqual(me["balance_cents"], 10)
        _, pushes = await listener
        self.assertIn(sent["packet_id"], [p.get("packet_id") for p in pushes if p["type"] == "PacketNotice"])
        await self.assert_audit_ok()


async def raw_login(address: tuple[str, int], user_id: int, token: str) -> list[m.Message]:
    """Logs in over a bare TCP connection with the package's codec: every frame the
    server sends until it closes (or goes quiet for a second)."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(codec.encode(m.Frame(1, m.Login(user_id, token.encode()))))
    got: list[m.Message] = []
    buf = b""
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(4096), 1.0)
            except TimeoutError:
                break
            if not chunk:
                break
            buf += chunk
            while (size := codec.check(buf)) is not None:
                got.append(codec.decode(buf[:size]).message)
                buf = buf[size:]
    finally:
        writer.close()
    return got


@unittest.skipIf(BINARY is None, NO_BINARY)
class LiveTokens(ServerTest):
    """Sessions end with their tokens: a server that asks for a fresh token 30 s before
    the end, with no leeway, so a token minted to live 5 s is asked about within a
    second of the login (the server's timers tick once a second). It also hands out demo
    tokens (`GET /token?user=N`)."""

    config = "refresh_before_secs = 30\ntoken_leeway_secs = 0\n"
    extra_args = ["--demo-login"]
    workers = 1

    async def test_a_jwt_logs_in_as_the_user_it_names(self) -> None:
        token = hb.make_token(SECRET, 301)
        # user_id left out (0 on the wire: whoever the token names), then given as the sub.
        for given in (None, 301):
            async with hb.connect(self.server.tcp_url, token=token, user_id=given) as c:
                self.assertEqual(c.user_id, 301)
                self.assertGreater((await c.ping()).server_time_us, 0)
        async with hb.connect(self.server.http_url, token=token) as c:
            self.assertEqual(c.user_id, 301)
            self.assertEqual((await c.me()).user_id, 301)
        # The frame's user must be the token's.
        got = await raw_login(self.server.tcp, 302, token)
        self.assertEqual(got[:2], [m.LoginReply(ResultCode.BAD_TOKEN, 302),
                                   m.Kick(KickReason.BAD_TOKEN, "bad token: other-user")])
        self.assertEqual(await raw_login(self.server.tcp, 0, token), [m.LoginReply(ResultCode.OK, 301)])

    async def test_forged_and_expired_tokens_are_refused(self) -> None:
        now = int(time.time())
        refused = {
            "forged": hb.make_token("not-the-secret", 311),
            "expired": hb.make_token(SECRET, 311, ttl_s=60, now=now - 120),
            "another kid": hb.make_token(SECRET, 311, kid="elsewhere"),
            "too long-lived": hb.make_token(SECRET, 311, ttl_s=2 * 86400),
            "not a JWT": "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70",
        }
        for why, token in refused.items():
            with self.subTest(why):
                # On the wire: login-reply bad-token, then kick bad-token, then the close.
                got = await raw_login(self.server.tcp, 0, token)
                self.assertEqual(got[0], m.LoginReply(ResultCode.BAD_TOKEN, 0))
                # The kick says why the token was refused (`bad token: expired`, ...).
                self.assertRegex(got[1].text, r"^bad token: [a-z-]+$")
                self.assertEqual(got, [m.LoginReply(ResultCode.BAD_TOKEN, 0),
                                       m.Kick(KickReason.BAD_TOKEN, got[1].text)])
                for url in (self.server.tcp_url, self.server.http_url):
                    started = time.monotonic()
                    with self.assertRaises(hb.HongbaoError) as caught:
                        async with hb.connect(url, token=token):
                            pass
                    self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN, url)
                    self.assertLess(time.monotonic() - started, 3.0)  # at once, not retried
        # Over HTTP: 401, `WWW-Authenticate: Bearer`, and the reason in the body.
        pool = HttpPool(*self.server.http)
        try:
            response = await pool.request("GET", "/v1/me", headers={"Authorization": f"Bearer {refused['expired']}"})
        finally:
            pool.close()
        self.assertEqual((response.status, response.headers.get("www-authenticate")), (401, "Bearer"))
        self.assertEqual(response.json()["result"], "bad-token")

    async def test_a_refresh_keeps_the_session_going_past_its_first_token(self) -> None:
        asked: list[float] = []

        async def fresh(user_id: int) -> str:
            asked.append(time.monotonic())
            await asyncio.sleep(0.05)  # the app server's round trip
            return hb.make_token(SECRET, user_id)  # an hour: no second refresh in this test

        first = hb.make_token(SECRET, 321, ttl_s=5)
        async with hb.connect(self.server.tcp_url, token=first, refresh=fresh) as c:
            started = time.monotonic()
            told = await next_event(c, hb.RefreshRequested, timeout_s=4)
            self.assertAlmostEqual(told.expires_at_ms / 1000, hb.token_expiry_s(first), delta=1)
            # Past the first token's end (5 s, no leeway) the session still answers.
            events = await collect(c, max(0.0, 7.0 - (time.monotonic() - started)))
            self.assertGreater((await c.ping()).rtt_us, 0)
            self.assertIn((await c.shake()).result, (ResultCode.NOTHING, ResultCode.WON))
            self.assertEqual(len(asked), 1)
            self.assertNotEqual(c.token, first)
            self.assertEqual(c.reconnects, 0)
            self.assertFalse([e for e in events if isinstance(e, (hb.Kicked, hb.ConnectionChanged))], events)
        await self.assert_audit_ok()

    async def test_with_no_fresh_token_the_session_lapses(self) -> None:
        asked: list[int] = []

        def none(user_id: int) -> None:
            asked.append(user_id)
            return None

        async with hb.connect(self.server.tcp_url, token=hb.make_token(SECRET, 331, ttl_s=3), refresh=none) as c:
            await next_event(c, hb.RefreshRequested, timeout_s=4)
            kicked = await next_event(c, hb.Kicked, timeout_s=6)
            self.assertEqual(kicked.reason, KickReason.EXPIRED)
            closed = await next_event(c, lambda e: isinstance(e, hb.ConnectionChanged)
                                      and e.state is hb.ConnectionState.CLOSED)
            self.assertEqual(closed.kick, KickReason.EXPIRED)
            self.assertIn("gave no token", closed.cause)
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.ping()
            self.assertEqual((caught.exception.kind, caught.exception.kick), (hb.ErrorKind.CLOSED, KickReason.EXPIRED))
        self.assertEqual(asked, [331])

    async def test_http_swaps_in_a_fresh_bearer_before_its_token_ends(self) -> None:
        asked: list[int] = []

        def fresh(user_id: int) -> str:
            asked.append(user_id)
            return hb.make_token(SECRET, user_id)

        first = hb.make_token(SECRET, 341, ttl_s=4)
        async with hb.connect(self.server.http_url, token=first, refresh=fresh, refresh_before_s=1.5) as c:
            self.assertEqual((await c.me()).user_id, 341)
            self.assertEqual(asked, [])  # the first token is still good for a while
            await asyncio.sleep(5.0)  # past its end
            self.assertEqual((await c.me()).user_id, 341)
            self.assertEqual(asked, [341])
        # Without a way to a fresh token, the first request after the end is refused.
        async with hb.connect(self.server.http_url, token=hb.make_token(SECRET, 342, ttl_s=2)) as c:
            await asyncio.sleep(3.0)
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.me()
            self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
            self.assertTrue(c.closed)

    async def test_a_revocation_kicks_the_session_for_good(self) -> None:
        async with hb.connect(self.server.tcp_url, token=hb.make_token(SECRET, 351)) as c:
            await c.ping()
            status, body = await self.server.admin_post("/v1/users/351/revoke", {})
            self.assertEqual((status, body["kicked"]), (200, 1), body)
            kicked = await next_event(c, hb.Kicked)
            self.assertEqual(kicked.reason, KickReason.REVOKED)
            await next_event(c, lambda e: isinstance(e, hb.ConnectionChanged) and e.state is hb.ConnectionState.CLOSED)
            with self.assertRaises(hb.HongbaoError) as caught:
                await c.ping()
            self.assertEqual(caught.exception.kick, KickReason.REVOKED)
        # Tokens issued before it are refused from now on (one of its very second too);
        # one issued from it on logs in.
        issued_before = hb.make_token(SECRET, 351, now=body["revoked_before"] - 1)
        with self.assertRaises(hb.HongbaoError) as caught:
            async with hb.connect(self.server.tcp_url, token=issued_before):
                pass
        self.assertEqual(caught.exception.kind, hb.ErrorKind.BAD_TOKEN)
        await asyncio.sleep(max(0.0, body["revoked_before"] - time.time()))
        async with hb.connect(self.server.tcp_url, token=hb.make_token(SECRET, 351)) as c:
            await c.ping()

    async def test_a_demo_token_logs_in(self) -> None:
        pool = HttpPool(*self.server.http)
        try:
            response = await pool.request("GET", "/token?user=361")
        finally:
            pool.close()
        self.assertEqual(response.status, 200)
        demo = response.json()
        self.assertEqual(set(demo), {"user_id", "token"})
        self.assertEqual((demo["user_id"], hb.token_user(demo["token"])), (361, 361))
        for url in (self.server.tcp_url, self.server.http_url):
            async with hb.connect(url, token=demo["token"]) as c:
                self.assertEqual(c.user_id, 361)
                await c.ping()


@unittest.skipIf(BINARY is None, NO_BINARY)
class LiveLimits(ServerTest):
    """Per-user limits (`[user_limits]`) tight enough to meet: a shake a second, a chat a
    second, a login every two seconds, each with a burst of one."""

    config = ("[user_limits]\nshake = { per_sec = 1, burst = 1 }\nchat = { per_sec = 1, burst = 1 }\n"
              "login = { per_sec = 0.5, burst = 1 }\n")
    workers = 1

    async def test_rate_limited_answers_carry_their_wait(self) -> None:
        for url, user in ((self.server.tcp_url, 401), (self.server.http_url, 402)):
            async with hb.connect(url, user_id=user, secret=SECRET) as c:
                self.assertIn((await c.shake()).result, (ResultCode.NOTHING, ResultCode.WON))
                limited = await c.shake()
                self.assertEqual(limited.result, ResultCode.RATE_LIMITED, url)
                assert limited.retry_after_ms is not None
                self.assertTrue(0 < limited.retry_after_ms <= 1000, limited)
                # The next shake waits out exactly that, and is allowed.
                self.assertGreater(c.shake_wait_s, limited.retry_after_ms / 1000 - 0.1)
                started = time.monotonic()
                self.assertIn((await c.shake()).result, (ResultCode.NOTHING, ResultCode.WON))
                self.assertGreaterEqual(time.monotonic() - started, limited.retry_after_ms / 1000 - 0.05)
                self.assertEqual((await c.chat(499, "one")).result, ResultCode.OFFLINE)
                chat = await c.chat(499, "two")
                self.assertEqual(chat.result, ResultCode.RATE_LIMITED, url)
                self.assertTrue(chat.retry_after_ms and 0 < chat.retry_after_ms <= 1000, chat)
                self.assertIn("limit", chat.error or "")

    async def test_a_rate_limited_login_is_tried_again_after_its_wait(self) -> None:
        async with hb.connect(self.server.tcp_url, user_id=411, secret=SECRET):
            pass
        started = time.monotonic()
        async with hb.connect(self.server.tcp_url, user_id=411, secret=SECRET) as again:
            # Refused `rate-limited` at first (a login every 2 s), then let in.
            self.assertEqual(again.state, hb.ConnectionState.CONNECTED)
        self.assertGreaterEqual(time.monotonic() - started, 1.0)


@unittest.skipIf(BINARY is None, NO_BINARY)
class LiveOverload(ServerTest):
    """A server that admits one shake a second (one worker): the rest are `overloaded`."""

    extra_args = ["--max-shake-qps", "1"]
    workers = 1

    async def test_the_client_waits_as_the_server_asks(self) -> None:
        async with self.tcp(201) as c:
            overloaded = None
            for _ in range(20):
                shake = await c.shake()
                if shake.result is ResultCode.OVERLOADED:
                    overloaded = shake
                    break
            assert overloaded is not None, "the server never answered overloaded"
            self.assertIsNotNone(overloaded.retry_after_ms)
            assert overloaded.retry_after_ms is not None
            self.assertGreater(c.shake_wait_s, 0)
            started = time.monotonic()
            await c.shake()
            self.assertGreaterEqual(time.monotonic() - started, overloaded.retry_after_ms / 2000)
        await self.assert_audit_ok()

    async def test_http_429_carries_the_wait(self) -> None:
        async with self.http(202) as c:
            results = []
            for _ in range(5):
                results.append(await c.shake())
                if results[-1].result is ResultCode.OVERLOADED:
                    break
            self.assertIs(results[-1].result, ResultCode.OVERLOADED, results)
            self.assertIsNotNone(results[-1].retry_after_ms)  # from the body, or Retry-After
            self.assertGreater(c.shake_wait_s, 0)
        await self.assert_audit_ok()


if __name__ == "__main__":
    unittest.main()

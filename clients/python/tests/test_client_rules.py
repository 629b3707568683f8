"""The client's own rules, against a scripted server (fake_server.py): replies matched by
request id, sends retried under their key after a reconnect, no reconnect after
`replaced` or `bad-token`, shakes held back after `overloaded`, notices handed out once.
The live server tests (test_live_server.py) check the same flows end to end."""

from __future__ import annotations

import asyncio
import random
import time
import unittest

from fake_server import CLOSE, Conn, FakeServer

import hongbao_client as hb
from hongbao_client import messages as m
from hongbao_client.backoff import Backoff, ShakeGate
from hongbao_client.messages import Frame, KickReason, ResultCode


def client(server: FakeServer, **kwargs: object) -> hb.Client:
    # Fast, seeded back-off so the tests are quick and repeatable.
    kwargs.setdefault("backoff", Backoff(base_s=0.02, cap_s=0.2, rng=random.Random(1)))
    return hb.connect(server.url, user_id=7, secret="test-secret", **kwargs)  # type: ignore[arg-type]


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


class Token(unittest.TestCase):
    def test_matches_the_rust_vectors(self) -> None:
        # crates/proto/src/token.rs, known_vectors
        self.assertEqual(hb.make_token_hex("secret", 42),
                         "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70")
        self.assertEqual(hb.make_token_hex("", 0), "9979e4c3ee19965f9ecc6dca6b3954b10c18c1bfa105c512cc3ae58be85db71c")
        self.assertEqual(hb.make_token_hex(b"k", 2**64 - 1),
                         "ce4b782bd2451af0e0ba523cabb2b5b585eaa7c4f1afc53d89cb4ac4db192ea9")

    def test_hex_and_raw_forms_are_one_token(self) -> None:
        raw = hb.make_token("secret", 42)
        self.assertEqual(hb.raw_token(raw.hex()), raw)
        self.assertEqual(hb.raw_token(raw.hex().upper()), raw)
        self.assertEqual(hb.raw_token(raw), raw)


class Backoffs(unittest.TestCase):
    def test_exponential_with_half_jitter_and_a_cap(self) -> None:
        b = Backoff(base_s=1.0, cap_s=8.0, rng=random.Random(3))
        for attempt in range(8):
            nominal = min(8.0, 2.0**attempt)
            self.assertTrue(0.5 * nominal <= b.next_delay() <= 1.5 * nominal)
        b.reset()
        self.assertLessEqual(b.next_delay(), 1.5)

    def test_a_server_wait_wins(self) -> None:
        b = Backoff(base_s=0.1, rng=random.Random(4))
        self.assertTrue(2.5 <= b.next_delay(server_wait_s=5.0) <= 7.5)

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

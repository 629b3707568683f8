"""When a client comes back, on a simulated clock (sim.py): real `Client`s on a loop
whose clock jumps, their random source pinned or seeded, their dials answered by a
scripted gateway. The rules: full jitter after failures, reset by a login; the server's
hint (a kick's `retry_after_ms`, an HTTP `Retry-After`) followed at ½× to 1½× without
counting as a failure; terminal kicks never coming back; a dial nobody answers cut at
`connect_timeout_s`; and a thousand clients dropped at once coming back spread out, not
in one wave. test_client_rules.py checks the same over real sockets where timing allows.
"""

from __future__ import annotations

import asyncio
import random
import unittest

from sim import Pinned, SimGateway, busiest_bucket, run_virtual

import hongbao_client as hb
from hongbao_client.backoff import Backoff
from hongbao_client.messages import KickReason

#: Just under 1: a full-jitter draw lands at the very end of its window.
TOP = 0.999999
#: The dial's own latency in the simulated gateway.
LATENCY = 0.001


def now() -> float:
    return asyncio.get_running_loop().time()


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 4) for a, b in zip(times, times[1:])]


async def logged_in(rng: random.Random, **kwargs: object) -> tuple[SimGateway, hb.Client]:
    gateway = SimGateway()
    c = gateway.client(1, rng, **kwargs)  # type: ignore[arg-type]
    await c.start()
    assert c.state is hb.ConnectionState.CONNECTED
    return gateway, c


def events_so_far(c: hb.Client) -> list[object]:
    """What the client has told, without waiting (its queue, drained)."""
    got = []
    while not c._events.empty():
        got.append(c._events.get_nowait())
    return got


class FullJitter(unittest.TestCase):
    def test_a_lost_connection_is_tried_within_the_first_window_each_failure_doubles_it_a_login_resets_it(
            self) -> None:
        async def main() -> None:
            gateway, c = await logged_in(Pinned(TOP))
            gateway.answer = "refuse"
            dropped_at = now()
            gateway.live()[0].drop()
            await asyncio.sleep(4.0)
            times = [d.at for d in gateway.dials]
            self.assertAlmostEqual(times[1] - dropped_at, 0.5, places=4)
            self.assertEqual(gaps(times[1:]), [LATENCY + 1.0, LATENCY + 2.0])
            gateway.answer = "accept"
            await asyncio.sleep(15.0)
            self.assertIs(c.state, hb.ConnectionState.CONNECTED)
            back = len(gateway.dials)
            dropped_again = now()
            gateway.live()[0].drop()
            await asyncio.sleep(1.0)
            self.assertAlmostEqual(gateway.dials[back].at - dropped_again, 0.5, places=4,
                                   msg="the login reset it")
            await c.close()

        run_virtual(main())

    def test_the_window_stops_at_the_cap(self) -> None:
        async def main() -> None:
            gateway, c = await logged_in(Pinned(TOP), backoff=Backoff(base_s=0.5, cap_s=4.0, rng=Pinned(TOP)))
            gateway.answer = "refuse"
            gateway.live()[0].drop()
            await asyncio.sleep(60.0)
            waits = [round(g - LATENCY, 3) for g in gaps([d.at for d in gateway.dials][1:])]
            self.assertEqual(waits[:5], [1.0, 2.0, 4.0, 4.0, 4.0])
            await c.close()

        run_virtual(main())

    def test_a_come_back_kick_that_names_no_wait_is_a_full_jitter_step(self) -> None:
        async def main() -> None:
            for reason in (KickReason.IDLE, KickReason.SLOW_READER, KickReason.SHUTDOWN, KickReason.BAD_FRAME):
                gateway, c = await logged_in(Pinned(TOP))
                kicked_at = now()
                gateway.live()[0].kick(reason)
                await asyncio.sleep(1.0)
                self.assertAlmostEqual(gateway.dials[1].at - kicked_at, 0.5, places=4, msg=reason)
                self.assertIs(c.state, hb.ConnectionState.CONNECTED)
                await c.close()

        run_virtual(main())

    def test_a_dial_nobody_answers_is_cut_at_the_connect_timeout_and_backs_off(self) -> None:
        async def main() -> None:
            gateway, c = await logged_in(Pinned(TOP), connect_timeout_s=3.0)
            gateway.answer = "silent"
            gateway.live()[0].drop()
            await asyncio.sleep(0.5 + 3.0 + 1.0 + 1.0)
            times = [d.at for d in gateway.dials]
            self.assertEqual(len(times), 3)
            self.assertEqual(gaps(times[1:]), [3.0 + 1.0])  # cut after 3 s, then the second window
            await c.close()

        run_virtual(main())


class ServerHints(unittest.TestCase):
    def test_a_hinted_kick_waits_half_to_one_and_a_half_times_the_hint_and_says_so(self) -> None:
        async def main() -> None:
            for value, expected in ((0.0, 1.25), (0.5, 2.5), (TOP, 3.75)):
                gateway, c = await logged_in(Pinned(value))
                events_so_far(c)
                kicked_at = now()
                gateway.live()[0].kick(KickReason.SHUTDOWN, 2500)
                await asyncio.sleep(5.0)
                self.assertAlmostEqual(gateway.dials[1].at - kicked_at, expected, places=4)
                told = events_so_far(c)
                self.assertEqual(told[0], hb.Kicked(KickReason.SHUTDOWN, "kicked: shutdown", 2500))
                disconnected = told[1]
                assert isinstance(disconnected, hb.ConnectionChanged)
                self.assertAlmostEqual(disconnected.retry_in_s or 0, expected, places=4)
                await c.close()

        run_virtual(main())

    def test_a_hinted_wait_is_not_a_failure(self) -> None:
        async def main() -> None:
            gateway, c = await logged_in(Pinned(TOP))
            gateway.answer = "refuse"
            kicked_at = now()
            gateway.live()[0].kick(KickReason.SHUTDOWN, 2000)
            await asyncio.sleep(3.0 + LATENCY + 0.5 + LATENCY)
            times = [d.at for d in gateway.dials]
            self.assertAlmostEqual(times[1] - kicked_at, 3.0, places=4)
            self.assertEqual(gaps(times[1:3]), [LATENCY + 0.5])  # the first window: the hint did not count
            await c.close()

        run_virtual(main())

    def test_an_http_retry_after_is_followed_and_not_counted(self) -> None:
        async def main() -> None:
            gateway = SimGateway()
            gateway.answer = "busy"
            gateway.retry_after_s = 1.0
            c = gateway.client(1, Pinned(TOP))
            starting = asyncio.create_task(c.start())
            await asyncio.sleep(LATENCY + 1.5)  # the second dial, answered 503 again
            gateway.answer = "refuse"
            await asyncio.sleep(LATENCY + 1.5)  # the third, refused
            gateway.answer = "accept"
            await starting
            # Two hinted waits of 1½ s, then a refusal's step from the first window.
            self.assertEqual(gaps([d.at for d in gateway.dials]), [LATENCY + 1.5, LATENCY + 1.5, LATENCY + 0.5])
            self.assertIs(c.state, hb.ConnectionState.CONNECTED)
            await c.close()

        run_virtual(main())

    def test_terminal_kicks_never_come_back_whatever_wait_they_name(self) -> None:
        async def main() -> None:
            for reason in (KickReason.REPLACED, KickReason.BAD_TOKEN, KickReason.EXPIRED, KickReason.REVOKED):
                gateway, c = await logged_in(Pinned(TOP))
                gateway.live()[0].kick(reason, 1000)
                await asyncio.sleep(600.0)
                self.assertEqual(len(gateway.dials), 1, reason)
                self.assertIs(c.state, hb.ConnectionState.CLOSED, reason)
                await c.close()

        run_virtual(main())


class Storms(unittest.TestCase):
    N = 1000
    BUCKET_S = 0.1

    async def crowd(self, seed: int) -> tuple[SimGateway, list[hb.Client]]:
        gateway = SimGateway()
        rng = random.Random(seed)
        clients = [gateway.client(user, rng) for user in range(1, self.N + 1)]
        await asyncio.gather(*(c.start() for c in clients))
        self.assertEqual(len(gateway.live()), self.N)
        return gateway, clients

    def test_drained_with_a_hint_they_come_back_spread_over_the_window(self) -> None:
        async def main() -> None:
            gateway, clients = await self.crowd(51)
            kicked_at = now()
            for session in gateway.live():
                session.kick(KickReason.SHUTDOWN, 2500)
            await asyncio.sleep(5.0)
            back = [d.at for d in gateway.dials[self.N:]]
            self.assertEqual(len(back), self.N, "each came back once")
            self.assertTrue(all(1.25 <= t - kicked_at <= 3.75 for t in back))
            # Each dial is uniform over a 2.5 s window: a 100 ms bucket expects
            # N·0.1/2.5 = 40, binomial σ = √(40·0.96) ≈ 6.2; 40 + 6σ ≈ 77. Unspread: 1000.
            self.assertLessEqual(busiest_bucket(back, kicked_at, self.BUCKET_S), 77)
            self.assertEqual(len(gateway.live()), self.N)
            for c in clients:
                await c.close()

        run_virtual(main())

    def test_a_gateway_that_refuses_for_5_s_is_retried_spread_out_and_all_come_back(self) -> None:
        async def main() -> None:
            gateway, clients = await self.crowd(52)
            gateway.answer = "refuse"
            dropped_at = now()
            for session in gateway.live():
                session.drop()
            await asyncio.sleep(5.0)
            retries = gateway.dials[self.N:]
            # The first wave (each user's first retry) is uniform over [0, 0.5 s): 200 a
            # bucket expected, σ = √(1000·0.2·0.8) ≈ 12.6; 200 + 6σ ≈ 276.
            first: dict[int, float] = {}
            for d in retries:
                first.setdefault(d.user_id, d.at)
            self.assertEqual(len(first), self.N)
            self.assertTrue(all(t - dropped_at < 0.5 for t in first.values()))
            self.assertLessEqual(busiest_bucket(list(first.values()), dropped_at, self.BUCKET_S), 276)
            # Over the whole outage: a user's k-th retry is its (k-1)-th plus a draw from
            # [0, 0.5·2^k s), whose density is at most 1 / (0.5·2^k) whatever came before,
            # so a bucket expects at most Σ N·0.1/(0.5·2^k) = 400 retries, σ ≤ 20; 400 + 6σ.
            self.assertLessEqual(busiest_bucket([d.at for d in retries], dropped_at, self.BUCKET_S), 520)
            gateway.answer = "accept"
            await asyncio.sleep(60.0)
            self.assertEqual(len(gateway.live()), self.N, "all logged in again")
            self.assertTrue(all(c.state is hb.ConnectionState.CONNECTED for c in clients))
            for c in clients:
                await c.close()

        run_virtual(main())


if __name__ == "__main__":
    unittest.main()

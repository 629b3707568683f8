"""Throughput sanity: one Python process, many TCP users shaking on a fixed schedule.

    python3 clients/python/bench.py                      # starts its own server (target/…/hongbao)
    python3 clients/python/bench.py --server tcp://127.0.0.1:7000 --admin http://127.0.0.1:7001 \
        --admin-key-file DATA_DIR/admin.key

Users log in with JWTs minted here from the server's secret (`--secret`, else
$HONGBAO_SECRET, else the development secret), as an app server would mint them.

Each of `--users` users logs in over its own connection, then shakes every
users/rate seconds, the users' phases spread evenly over that interval, so that the
whole offers `--rate` shakes a second for `--seconds`. A shake's latency is measured
from the moment the schedule meant it to go out, not from when it went: a user whose
previous shake came back late starts the next one late, and that lateness is counted
in the next one's latency (no coordinated omission). The script also reports how late
shakes left this process (`send lag`): when that grows, the client, not the server, is
what was measured.

A shake campaign runs meanwhile (`--campaign-rate` packets a second), so some shakes
win and wait for the ledger commit; their latency is reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hongbao_client as hb  # noqa: E402
from hongbao_client.devserver import DevServer, find_binary  # noqa: E402
from hongbao_client.http1 import HttpPool  # noqa: E402

#: User ids of the load, far from those the tests use.
FIRST_USER = 1_000_000


class LatencyHistogram:
    """Latencies in log buckets 1% wide: bounded memory however long the run, and
    percentiles within 1%."""

    _GROWTH = math.log(1.01)

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.max_us = 0

    def record(self, latency_us: float) -> None:
        latency_us = max(1.0, latency_us)
        self.buckets[int(math.log(latency_us) / self._GROWTH)] += 1
        self.count += 1
        self.max_us = max(self.max_us, int(latency_us))

    def percentile_us(self, p: float) -> float:
        if not self.count:
            return float("nan")
        rank = math.ceil(p / 100 * self.count)
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                # The bucket's upper edge, but never past the largest seen.
                return min(math.exp((bucket + 1) * self._GROWTH), float(self.max_us))
        return float(self.max_us)

    def line(self) -> str:
        if not self.count:
            return "n=0"
        ms = {p: self.percentile_us(p) / 1000 for p in (50, 90, 99, 99.9)}
        return (f"n={self.count} p50={ms[50]:.2f}ms p90={ms[90]:.2f}ms p99={ms[99]:.2f}ms "
                f"p99.9={ms[99.9]:.2f}ms max={self.max_us / 1000:.2f}ms")


class Results:
    def __init__(self) -> None:
        self.latency = LatencyHistogram()
        self.latency_won = LatencyHistogram()
        self.send_lag = LatencyHistogram()
        self.results: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()


async def log_in_all(url: str, users: int, secret: str, parallel: int) -> list[hb.Client]:
    gate = asyncio.Semaphore(parallel)

    async def one(user_id: int) -> hb.Client:
        async with gate:
            client = hb.connect(url, user_id=user_id, secret=secret, connect_timeout_s=60, request_timeout_s=30)
            await client.start()
            return client

    return list(await asyncio.gather(*(one(FIRST_USER + i) for i in range(users))))


async def shake_on_schedule(client: hb.Client, start: float, offset_s: float, interval_s: float, end: float,
                            results: Results) -> None:
    loop = asyncio.get_running_loop()
    k = 0
    while (intended := start + offset_s + k * interval_s) < end:
        k += 1
        if (delay := intended - loop.time()) > 0:
            await asyncio.sleep(delay)
        results.send_lag.record((loop.time() - intended) * 1e6)
        try:
            shake = await client.shake()
        except hb.HongbaoError as e:
            results.errors[e.kind.value] += 1
            continue
        latency_us = (loop.time() - intended) * 1e6
        results.latency.record(latency_us)
        if shake.won:
            results.latency_won.record(latency_us)
        results.results[shake.result.wire_name] += 1


async def admin(url: str, key: str, method: str, path: str, body: dict[str, object] | None = None) -> object:
    _, host, port = hb.parse_url(url)
    pool = HttpPool(host, port)
    try:
        headers = {"Authorization": f"Bearer {key}"}
        return (await pool.request(method, path, headers=headers, json_body=body)).json()
    finally:
        pool.close()


async def run(args: argparse.Namespace, server_url: str, admin_url: str, admin_key: str, secret: str) -> int:
    if args.campaign_rate:
        await admin(admin_url, admin_key, "POST", "/v1/campaigns/shake", {
            "packets": args.campaign_rate * (args.seconds + 60), "rate_per_sec": args.campaign_rate,
            "amount_min": 100, "amount_max": 500})
    started_login = time.monotonic()
    clients = await log_in_all(server_url, args.users, secret, args.login_parallel)
    print(f"logged in {len(clients)} users in {time.monotonic() - started_login:.1f} s", flush=True)

    results = Results()
    loop = asyncio.get_running_loop()
    interval_s = args.users / args.rate
    start = loop.time() + 0.5
    end = start + args.seconds
    cpu_before = time.process_time()
    await asyncio.gather(*(shake_on_schedule(c, start, i * interval_s / args.users, interval_s, end, results)
                           for i, c in enumerate(clients)))
    wall_s = loop.time() - start
    cpu_s = time.process_time() - cpu_before
    await asyncio.gather(*(c.close() for c in clients))

    done = results.latency.count
    print(f"offered: {args.rate}/s from {args.users} TCP users for {args.seconds} s "
          f"(every user every {interval_s:.2f} s)")
    print(f"answered: {done} shakes in {wall_s:.1f} s = {done / wall_s:.0f}/s; "
          f"results {dict(results.results)}; errors {dict(results.errors) or 'none'}")
    print(f"latency from intended send (all):  {results.latency.line()}")
    print(f"latency from intended send (won):  {results.latency_won.line()}")
    print(f"send lag in this process:          {results.send_lag.line()}")
    print(f"client CPU: {cpu_s:.1f} s over {wall_s:.1f} s ({100 * cpu_s / wall_s:.0f}% of one core)")
    audit = await admin(admin_url, admin_key, "GET", "/v1/audit")
    print(f"audit ok: {audit['ok']}")  # type: ignore[index]
    return 0 if audit["ok"] and not results.errors else 1  # type: ignore[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="tcp://HOST:PORT of a running server (default: start one)")
    parser.add_argument("--admin", help="http://HOST:PORT of its admin API (with --server)")
    parser.add_argument("--admin-key-file", help="a file holding an operator key of that admin API (with --server)")
    parser.add_argument("--secret", default=os.environ.get("HONGBAO_SECRET", hb.DEV_SECRET))
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=1000, help="shakes a second, all users together")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--campaign-rate", type=int, default=100, help="packets a second released (0: none)")
    parser.add_argument("--workers", type=int, default=2, help="gateway workers of a server started here")
    parser.add_argument("--login-parallel", type=int, default=100)
    args = parser.parse_args()

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}", flush=True)
    if args.server:
        if not args.admin or not args.admin_key_file:
            parser.error("--server needs --admin and --admin-key-file")
        admin_key = Path(args.admin_key_file).read_text().strip()
        return asyncio.run(run(args, args.server, args.admin, admin_key, args.secret))
    binary = find_binary()
    if binary is None:
        print("no hongbao binary: set $HONGBAO_BIN or build target/release/hongbao", file=sys.stderr)
        return 2
    print(f"server: {binary} ({'release' if 'release' in binary.parts else 'debug'} build), "
          f"--workers {args.workers}", flush=True)
    server = DevServer(binary, workers=args.workers, secret=args.secret,
                       extra_args=["--connections", str(args.users + 1000)]).start()
    try:
        return asyncio.run(run(args, server.tcp_url, f"http://{server.admin[0]}:{server.admin[1]}",
                               server.admin_key(), args.secret))
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

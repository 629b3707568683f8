#!/usr/bin/env node
// Throughput sanity check: one Node process with the library holds USERS WebSocket users
// and shakes RATE times a second in total for SECONDS, round-robin over the users (each
// user shakes every USERS/RATE seconds).
//
// No coordinated omission: shake k is due at t0 + k/RATE on an absolute schedule fixed
// before the run, and its latency is measured from that due time, not from when the
// driver got round to sending it — a stalled client or server shows up in the figures
// instead of silently thinning the load. Latencies go into a log-linear histogram
// (1/64 of a power of two per bucket, under 1.6% error), never a list.
//
//   npm run build && node bench/throughput.mjs [--users 10000] [--rate 5000] [--seconds 20]
//       [--form binary|json] [--url ws://HOST:PORT/ws --secret S]
//
// Without --url it starts `hongbao serve` itself ($HONGBAO_BIN, else the newer of
// target/release and target/debug) on loopback with 2 workers and a shake campaign, and
// stops it at the end.

import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

import { connect, devToken } from "../dist/src/node.js";
import { hongbaoBinary, startServer, TEST_SECRET } from "../dist/test/support/server.js";

const { values: opts } = parseArgs({
  options: {
    users: { type: "string", default: "10000" },
    rate: { type: "string", default: "5000" },
    seconds: { type: "string", default: "20" },
    form: { type: "string", default: "binary" },
    url: { type: "string" },
    secret: { type: "string" },
    workers: { type: "string", default: "2" },
    "connect-concurrency": { type: "string", default: "200" },
  },
});
const USERS = Number(opts.users);
const RATE_PER_SEC = Number(opts.rate);
const SECONDS = Number(opts.seconds);
const FIRST_USER = 1_000_000;

/** Log-linear histogram of microseconds. */
class Histogram {
  static SUB = 64;
  counts = new Map();
  total = 0;
  max = 0;

  record(us) {
    const v = Math.max(1, Math.round(us));
    const exp = Math.floor(Math.log2(v));
    const sub = exp < 6 ? v : Math.floor(v / 2 ** (exp - 6)) - 64;
    const key = exp * Histogram.SUB + sub;
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
    this.total++;
    if (v > this.max) this.max = v;
  }

  /** The value at quantile q, as the upper edge of its bucket. */
  quantile(q) {
    const rank = Math.ceil(q * this.total);
    let seen = 0;
    for (const key of [...this.counts.keys()].sort((a, b) => a - b)) {
      seen += this.counts.get(key);
      if (seen >= rank) {
        const exp = Math.floor(key / Histogram.SUB);
        const sub = key % Histogram.SUB;
        return Math.min(this.max, exp < 6 ? sub : (sub + 64 + 1) * 2 ** (exp - 6));
      }
    }
    return this.max;
  }
}

async function main() {
  let server;
  let url = opts.url;
  let secret = opts.secret ?? TEST_SECRET;
  if (!url) {
    const binary = hongbaoBinary();
    if (!binary) throw new Error("no hongbao binary: build one or pass --url");
    console.log(`server: ${binary} serve --workers ${opts.workers} (started by this script)`);
    server = await startServer({ workers: Number(opts.workers) });
    url = server.ws;
    await server.adminPost("/v1/campaigns/shake", { packets: 100000, rate_per_sec: 500, amount_min: 1, amount_max: 100 });
  }
  const clients = [];
  const counts = { won: 0, nothing: 0, overloaded: 0, heldBack: 0, "rate-limited": 0, unavailable: 0, refused: 0, timeout: 0, lost: 0, other: 0 };
  try {
    // ----- connect and log in every user, a bounded number at a time
    const connectStarted = performance.now();
    let next = 0;
    const connectOne = async () => {
      while (next < USERS) {
        const i = next++;
        const userId = FIRST_USER + i;
        clients[i] = await connect({
          url,
          form: opts.form,
          userId,
          // JWTs minted here with the server's secret, as an app server would; a run
          // longer than their hour gets fresh ones when the server asks.
          token: await devToken(secret, userId),
          refresh: (user) => devToken(secret, user),
          keepAliveMs: 0,
          requestTimeoutMs: 30_000,
          connectTimeoutMs: 60_000,
        });
      }
    };
    await Promise.all(Array.from({ length: Number(opts["connect-concurrency"]) }, connectOne));
    const connectSecs = (performance.now() - connectStarted) / 1000;
    console.log(`logged in ${USERS} users (${opts.form} form) in ${connectSecs.toFixed(1)} s`);

    // ----- shake on an absolute schedule
    const latency = new Histogram();
    const sendLag = new Histogram();
    const total = Math.round(RATE_PER_SEC * SECONDS);
    const intervalMs = 1000 / RATE_PER_SEC;
    const t0 = performance.now() + 200;
    let issued = 0;
    let settled = 0;
    let done;
    const finished = new Promise((r) => (done = r));
    const settle = () => {
      if (++settled === total) done();
    };
    const shakeOne = (k) => {
      const dueMs = t0 + k * intervalMs;
      sendLag.record((performance.now() - dueMs) * 1000);
      clients[k % USERS].shake().then(
        (r) => {
          if ((r.result === "overloaded" || r.result === "rate-limited") && r.heldBack) counts.heldBack++;
          else {
            latency.record((performance.now() - dueMs) * 1000);
            counts[r.result in counts ? r.result : "other"]++;
          }
          settle();
        },
        (e) => {
          counts[e.kind === "timeout" ? "timeout" : e.kind === "connection-lost" ? "lost" : "other"]++;
          settle();
        },
      );
    };
    const drive = () => {
      const now = performance.now();
      while (issued < total && t0 + issued * intervalMs <= now) shakeOne(issued++);
      if (issued < total) setTimeout(drive, Math.max(0, t0 + issued * intervalMs - performance.now()));
    };
    setTimeout(drive, 200);
    await finished;
    const elapsedSecs = (performance.now() - t0) / 1000;

    const ms = (us) => (us / 1000).toFixed(1);
    const answered = latency.total;
    console.log(`shakes: ${total} scheduled at ${RATE_PER_SEC}/s over ${SECONDS} s, all settled after ${elapsedSecs.toFixed(1)} s`);
    console.log(`  answered by the server: ${answered} (${(answered / elapsedSecs).toFixed(0)}/s)`);
    console.log(`  ${Object.entries(counts).map(([k, v]) => `${k}=${v}`).join(" ")}`);
    console.log(
      `  latency from the due time, ms: p50=${ms(latency.quantile(0.5))} p90=${ms(latency.quantile(0.9))} ` +
        `p99=${ms(latency.quantile(0.99))} p99.9=${ms(latency.quantile(0.999))} max=${ms(latency.max)}`,
    );
    console.log(`  driver lateness (send time − due time), ms: p50=${ms(sendLag.quantile(0.5))} p99=${ms(sendLag.quantile(0.99))} max=${ms(sendLag.max)}`);
    if (server) {
      const audit = await server.adminGet("/v1/audit");
      console.log(`  server audit ok=${audit.ok}`);
    }
  } finally {
    await Promise.all(clients.filter(Boolean).map((c) => c.close()));
    await server?.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});

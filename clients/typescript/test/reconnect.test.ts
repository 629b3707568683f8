/**
 * When a client comes back, on a simulated clock (support/sim.ts): real `WsClient`s and
 * `HttpClient`s, their random source pinned or seeded, their sockets and `fetch` scripted.
 * The rules: full jitter after failures, reset by a login; the server's hint (a kick's
 * `retry_after_ms`, a refused upgrade's or an HTTP answer's `Retry-After`) followed at ½×
 * to 1½× without counting as a failure; terminal kicks never coming back; an attempt
 * nobody answers cut at `dialTimeoutMs`; and a thousand clients dropped at once coming
 * back spread out, not in one wave.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import type { Client } from "../src/client.js";
import { connectUsing } from "../src/connect.js";
import type { ClientEvents } from "../src/events.js";
import type { KickReason } from "../src/protocol.js";
import { SimClock, SimGateway, busiestBucket, seeded } from "./support/sim.js";

/** Just under 1: a full-jitter draw lands on the last millisecond of its window. */
const TOP = 0.999999;

/** A gateway and one client of user 1 logged in on it, at simulated time `t`. */
async function loggedIn(random: () => number, options: object = {}) {
  const clock = new SimClock();
  const gateway = new SimGateway(clock);
  const pending = gateway.connect(1, { random, ...options });
  await clock.advance(10);
  const client = await pending;
  assert.equal(client.state, "open");
  return { clock, gateway, client };
}

/** The gaps between the dials after the first `skip`, in ms. */
function gaps(dials: number[], skip = 0): number[] {
  return dials.slice(skip + 1).map((t, i) => t - dials[skip + i]!);
}

describe("reconnecting after a failure: full jitter", () => {
  test("a lost connection is tried within the first window; each failure doubles it; a login resets it", async () => {
    const { clock, gateway, client } = await loggedIn(() => TOP);
    gateway.answer = "refuse";
    const droppedAt = clock.nowMs();
    gateway.live()[0]!.drop();
    await clock.advance(4000);
    // 499 after the drop, then each refusal (1 ms after its dial) waits 999, 1999.
    const dials = gateway.dials;
    assert.equal(dials[1]! - droppedAt, 499);
    assert.deepEqual(gaps(dials, 1), [1 + 999, 1 + 1999]);
    gateway.answer = "accept";
    await clock.advance(15_000);
    assert.equal(client.state, "open");
    const backAt = gateway.dials.length;
    const droppedAgain = clock.nowMs();
    gateway.live()[0]!.drop();
    await clock.advance(1000);
    assert.equal(gateway.dials[backAt]! - droppedAgain, 499, "the login reset the count");
    await client.close();
  });

  test("the window stops at the cap", async () => {
    const { clock, gateway, client } = await loggedIn(() => TOP, { reconnect: { baseMs: 500, maxMs: 4000 } });
    gateway.answer = "refuse";
    gateway.live()[0]!.drop();
    await clock.advance(60_000);
    const waits = gaps(gateway.dials, 1).map((g) => g - 1); // less the refusal's 1 ms
    assert.deepEqual(waits.slice(0, 5), [999, 1999, 3999, 3999, 3999]);
    await client.close();
  });

  test("a come-back kick that names no wait is a full-jitter step", async () => {
    for (const reason of ["idle", "slow-reader", "shutdown", "bad-frame"] as KickReason[]) {
      const { clock, gateway, client } = await loggedIn(() => TOP);
      const kickedAt = clock.nowMs();
      gateway.live()[0]!.kick(reason);
      await clock.advance(1000);
      assert.equal(gateway.dials[1]! - kickedAt, 499, reason);
      assert.equal(client.state, "open", reason);
      await client.close();
    }
  });

  test("an attempt nobody answers is cut at dialTimeoutMs, and backs off", async () => {
    const { clock, gateway, client } = await loggedIn(() => TOP, { dialTimeoutMs: 3000 });
    gateway.answer = "silent";
    const droppedAt = clock.nowMs();
    gateway.live()[0]!.drop();
    await clock.advance(499 + 3000 + 999 + 3000 + 1);
    const dials = gateway.dials;
    assert.equal(dials[1]! - droppedAt, 499);
    assert.equal(dials[2]! - dials[1]!, 3000 + 999, "cut after 3 s, then the second window");
    assert.equal(dials.length, 3);
    assert.ok(gateway.sockets[1]!.closed, "the silent attempt was aborted");
    await client.close();
  });
});

describe("the server's hint", () => {
  test("a hinted kick waits ½× to 1½× of the hint, and says so in the event", async () => {
    for (const [random, expected] of [[() => 0, 1250], [() => 0.5, 2500], [() => TOP, 3750]] as const) {
      const { clock, gateway, client } = await loggedIn(random);
      const kicks: ClientEvents["kick"][] = [];
      client.on("kick", (k) => kicks.push(k));
      const kickedAt = clock.nowMs();
      gateway.live()[0]!.kick("shutdown", 2500);
      await clock.advance(5000);
      assert.equal(gateway.dials[1]! - kickedAt, expected);
      assert.deepEqual(kicks, [{ reason: "shutdown", text: "kicked: shutdown", retryAfterMs: 2500 }]);
      await client.close();
    }
  });

  test("a hinted wait is not a failure: the next failure's window is still the first", async () => {
    const { clock, gateway, client } = await loggedIn(() => TOP);
    gateway.answer = "refuse";
    const kickedAt = clock.nowMs();
    gateway.live()[0]!.kick("shutdown", 2000);
    await clock.advance(3000 + 1 + 499 + 1);
    const dials = gateway.dials;
    assert.equal(dials[1]! - kickedAt, 3000);
    assert.equal(dials[2]! - dials[1]!, 1 + 499, "window 500: the hint did not count");
    await client.close();
  });

  test("a refused upgrade's Retry-After is followed, and not counted", async () => {
    const clock = new SimClock();
    const gateway = new SimGateway(clock);
    gateway.answer = "busy";
    gateway.retryAfterMs = 1000;
    const pending = gateway.connect(1, { random: () => TOP });
    await clock.advance(1 + 1500); // the second dial, answered 503 again
    gateway.answer = "refuse";
    await clock.advance(1 + 1500); // the third, refused
    gateway.answer = "accept";
    await clock.advance(1000);
    const client = await pending;
    // Two hinted waits of 1½ s, then a refusal's full-jitter step from the first window.
    assert.deepEqual(gaps(gateway.dials), [1 + 1500, 1 + 1500, 1 + 499]);
    assert.equal(client.state, "open");
    await client.close();
  });

  test("terminal kicks never schedule a reconnect, whatever wait they name", async () => {
    for (const reason of ["replaced", "bad-token", "expired", "revoked"] as KickReason[]) {
      const { clock, gateway, client } = await loggedIn(() => TOP);
      gateway.live()[0]!.kick(reason, 1000);
      await clock.advance(10 * 60_000);
      assert.equal(gateway.dials.length, 1, reason);
      assert.equal(client.state, "closed", reason);
      assert.equal(clock.pending, 0, `${reason}: no timer left behind`);
    }
  });

  test("an HTTP client's start answered 503 with Retry-After waits ½× to 1½× of it", async () => {
    for (const [random, expected] of [[() => 0, 500], [() => TOP, 1500]] as const) {
      const clock = new SimClock();
      const calls: number[] = [];
      const fakeFetch = async () => {
        calls.push(clock.nowMs());
        return calls.length === 1
          ? { status: 503, headers: header("retry-after", "1"), text: async () => '{"result":"unavailable","error":"busy"}' }
          : { status: 200, headers: header(), text: async () => '{"notices":[]}' };
      };
      const connect = connectUsing({ sockets: () => () => assert.fail("no WebSocket over HTTP") });
      const fetch = fakeFetch as unknown as typeof globalThis.fetch;
      const pending = connect({ url: "http://gateway.sim:7003", token: "sim-token", userId: 1, clock, random, fetch });
      await clock.advance(2000);
      const client = await pending;
      assert.equal(calls[1]! - calls[0]!, expected);
      assert.equal(client.state, "open");
      await client.close();
    }
  });
});

function header(name?: string, value?: string) {
  return { get: (asked: string) => (asked.toLowerCase() === name ? value! : null) };
}

describe("storms: a thousand clients dropped at once", () => {
  const N = 1000;
  const BUCKET_MS = 100;

  async function crowd(seed: number) {
    const clock = new SimClock();
    const gateway = new SimGateway(clock);
    const random = seeded(seed);
    const pending: Promise<Client>[] = [];
    for (let user = 1; user <= N; user++) pending.push(gateway.connect(user, { random }));
    await clock.advance(10);
    const clients = await Promise.all(pending);
    assert.equal(gateway.live().length, N);
    return { clock, gateway, clients };
  }

  test("drained with a 2.5 s hint, they come back over 1.25–3.75 s, none in a wave", async () => {
    const { clock, gateway, clients } = await crowd(51);
    const kickedAt = clock.nowMs();
    for (const socket of gateway.live()) socket.kick("shutdown", 2500);
    await clock.advance(5000);
    const back = gateway.dials.slice(N);
    assert.equal(back.length, N, "each came back once");
    assert.ok(back.every((t) => t - kickedAt >= 1250 && t - kickedAt <= 3750));
    // Each dial is uniform over a 2,500 ms window: a 100 ms bucket expects N·100/2500 =
    // 40, binomial σ = √(40·0.96) ≈ 6.2; 40 + 6σ ≈ 77. Without the spread: 1000 in one.
    assert.ok(busiestBucket(back, kickedAt, BUCKET_MS) <= 77, `busiest bucket ${busiestBucket(back, kickedAt, BUCKET_MS)}`);
    assert.equal(gateway.live().length, N);
    for (const c of clients) await c.close();
  });

  test("a gateway that refuses for 5 s is retried spread out, and all come back", async () => {
    const { clock, gateway, clients } = await crowd(52);
    gateway.answer = "refuse";
    const droppedAt = clock.nowMs();
    for (const socket of gateway.live()) socket.drop();
    await clock.advance(5000);
    const retries = gateway.dials.slice(N);
    // The first wave (each user's first retry) is uniform over [0, 500): 200 a bucket
    // expected, σ = √(1000·0.2·0.8) ≈ 12.6; 200 + 6σ ≈ 276.
    const firstOf = new Map<number, number>();
    for (const s of gateway.sockets.slice(N)) if (!firstOf.has(s.userId)) firstOf.set(s.userId, s.dialedAtMs);
    const firstWave = [...firstOf.values()];
    assert.equal(firstWave.length, N);
    assert.ok(firstWave.every((t) => t - droppedAt < 500));
    assert.ok(busiestBucket(firstWave, droppedAt, BUCKET_MS) <= 276);
    // Over the whole outage: a client's k-th retry comes at its (k-1)-th plus a draw from
    // [0, 500·2^k), whose density is at most 1 / (500·2^k) whatever came before; so a
    // bucket expects at most Σ N·100/(500·2^k) = 400 retries, σ ≤ 20; 400 + 6σ = 520.
    assert.ok(busiestBucket(retries, droppedAt, BUCKET_MS) <= 520);
    gateway.answer = "accept";
    await clock.advance(60_000);
    assert.equal(gateway.live().length, N, "all logged in again");
    assert.ok(clients.every((c) => c.state === "open"));
    for (const c of clients) await c.close();
  });
});

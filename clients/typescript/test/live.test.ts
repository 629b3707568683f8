/**
 * The library against a real `hongbao serve` (started here; skipped with a message when
 * no binary is built): every flow over the WebSocket binary form, its JSON form and the
 * HTTP API — login, shake until a win, a send and its retry (money moves once), open,
 * chat, a notice waiting at login, a `replaced` kick, a reconnect after a worker is
 * killed, the waits an overloaded server asks for — then the server's money audit.
 */

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, describe, test } from "node:test";

import { connect, devToken, type Client, type ConnectOptions, type PacketNotice, type ShakeResult } from "../src/node.js";
import type { ClientState } from "../src/events.js";
import type { WsClient } from "../src/ws-client.js";
import { NO_BINARY_MESSAGE, TEST_SECRET, hongbaoBinary, startServer, type Server } from "./support/server.js";

const skip = hongbaoBinary() === undefined ? NO_BINARY_MESSAGE : false;
const FORMS = ["binary", "json", "http"] as const;
type Form = (typeof FORMS)[number];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function eventually<T>(what: string, probe: () => T | undefined | Promise<T | undefined>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/** Every client a test opens, closed at the end. */
const clients: Client[] = [];

async function login(server: Server, form: Form, userId: number, extra: Partial<ConnectOptions> = {}): Promise<Client> {
  const client = await connect({
    url: form === "http" ? server.http : server.ws,
    form: form === "json" ? "json" : "binary",
    userId,
    token: await devToken(TEST_SECRET, userId),
    keepAliveMs: 0,
    ...extra,
  });
  clients.push(client);
  return client;
}

async function shakeUntilWon(client: Client): Promise<Extract<ShakeResult, { result: "won" }>> {
  for (let i = 0; i < 400; i++) {
    const r = await client.shake();
    if (r.result === "won") return r;
    assert.ok(r.result === "nothing", `a shake answered ${JSON.stringify(r, bigints)}`);
    await sleep(20);
  }
  throw new Error("no win in 400 shakes");
}

function bigints(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? value.toString() : value;
}

async function balanceOf(client: Client): Promise<bigint> {
  const me = await client.me();
  assert.equal(me.result, "ok");
  return me.result === "ok" ? me.balanceCents : -1n;
}

/** Records a client's notices and states. */
function recorder() {
  const notices: PacketNotice[] = [];
  const states: ClientState[] = [];
  const chats: { fromUser: bigint; text: string }[] = [];
  const on: ConnectOptions["on"] = {
    "packet-notice": (n) => notices.push(n),
    state: (s) => states.push(s.state),
    chat: (c) => chats.push(c),
  };
  return { notices, states, chats, on };
}

describe("against hongbao serve", { skip }, () => {
  let server: Server;

  before(async () => {
    server = await startServer({ workers: 1 });
    await server.adminPost("/v1/campaigns/shake", { packets: 2000, rate_per_sec: 2000, amount_min: 100, amount_max: 500 });
  });

  after(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.stop();
  });

  test("login over each form; a wrong token is refused for good", async () => {
    for (const [i, form] of FORMS.entries()) {
      const client = await login(server, form, 100 + i);
      assert.equal(client.state, "open");
      assert.equal(client.transport, form === "http" ? "http" : "websocket");
      const pong = await client.ping();
      assert.equal(pong.result, "ok");
    }
    for (const form of FORMS) {
      await assert.rejects(
        connect({ url: form === "http" ? server.http : server.ws, form: form === "json" ? "json" : "binary", userId: 110, token: await devToken("wrong", 110) }),
        (e: Error & { kind?: string }) => e.kind === "bad-token",
        form,
      );
    }
  });

  for (const [i, form] of FORMS.entries()) {
    test(`${form}: shake until a win, send with a key and retry it, open, chat`, async () => {
      const base = 200 + i * 10;
      const [sender, alice, bob] = [base, base + 1, base + 2];
      const a = recorder();
      const b = recorder();
      const s = await login(server, form, sender);
      const ca = await login(server, form, alice, { on: a.on });
      const cb = await login(server, "binary", bob, { on: b.on });

      const won = await shakeUntilWon(s);
      assert.ok(won.amountCents >= 100n && won.amountCents <= 500n);
      assert.equal(await balanceOf(s), won.amountCents);

      // A send and its retry with the same key: one packet, money moved once.
      const key = `ts-${form}-${Date.now()}`;
      const request = { amountCents: 60, shares: 2, recipients: [alice, bob], idempotencyKey: key };
      const first = await s.send(request);
      assert.equal(first.result, "ok", JSON.stringify(first, bigints));
      if (first.result !== "ok") return;
      assert.equal(first.balanceCents, won.amountCents - 60n);
      assert.equal(first.idempotencyKey, key);
      const again = await s.send(request);
      assert.deepEqual(again, first);
      assert.equal(await balanceOf(s), won.amountCents - 60n);
      // The same key for another send is refused, and moves nothing.
      const other = await s.send({ ...request, amountCents: 61 });
      assert.equal(other.result, "bad-request");
      // A send without a key gets one.
      const keyless = await s.send({ amountCents: 1, shares: 1, recipients: [bob] });
      assert.equal(keyless.result, "ok");
      assert.ok(keyless.result === "ok" && keyless.idempotencyKey.length === 36);
      assert.equal(await balanceOf(s), won.amountCents - 61n);
      const broke = await s.send({ amountCents: 1_000_000, shares: 1, recipients: [bob] });
      assert.equal(broke.result, "insufficient-funds");

      // Both recipients hear of the packet (once) and open it; an open is idempotent.
      if (form !== "http") await eventually("alice's notice", () => a.notices.some((n) => n.packetId === first.packetId));
      else await ca.notices();
      await eventually("bob's notice", () => b.notices.some((n) => n.packetId === first.packetId));
      const notice = a.notices.find((n) => n.packetId === first.packetId)!;
      assert.deepEqual({ ...notice, expiresAtMs: 0n }, { packetId: first.packetId, fromUser: BigInt(sender), amountCents: 60n, shares: 2, expiresAtMs: 0n });
      const oa = await ca.open(first.packetId);
      const ob = await cb.open(first.packetId);
      assert.ok(oa.result === "opened" && ob.result === "opened", JSON.stringify([oa, ob], bigints));
      assert.equal(oa.amountCents + ob.amountCents, 60n);
      assert.deepEqual(await ca.open(first.packetId), { ...oa, result: "already-opened" });
      assert.equal((await s.open(first.packetId)).result, "not-a-recipient");
      assert.equal((await s.open(987654321)).result, "no-such-packet");
      assert.equal(a.notices.filter((n) => n.packetId === first.packetId).length, 1);

      // Chat: to a connected user (a WebSocket one), and to nobody.
      const text = `新年快乐 🧧 from ${form}`;
      assert.deepEqual(await s.chat(bob, text), { result: "delivered" });
      await eventually("bob's chat", () => b.chats.some((c) => c.text === text && c.fromUser === BigInt(sender)));
      assert.deepEqual(await s.chat(999_999, "anyone?"), { result: "offline" });
    });
  }

  test("a notice waits for an offline user, and comes once at login", async () => {
    const sender = await login(server, "binary", 300);
    await shakeUntilWon(sender);
    for (const [i, form] of FORMS.entries()) {
      const offline = 310 + i;
      const sent = await sender.send({ amountCents: 5, shares: 1, recipients: [offline] });
      assert.equal(sent.result, "ok");
      if (sent.result !== "ok") continue;
      const r = recorder();
      const client = await login(server, form, offline, { on: r.on });
      const notice = await eventually(`${form} notice at login`, () => r.notices.find((n) => n.packetId === sent.packetId));
      assert.equal(notice.fromUser, 300n);
      // Asked again (the server lists it, it is still unopened): no second event.
      const listed = await client.notices();
      assert.ok(listed.some((n) => n.packetId === sent.packetId));
      assert.equal(r.notices.filter((n) => n.packetId === sent.packetId).length, 1);
      assert.deepEqual(await client.open(sent.packetId), { result: "opened", packetId: sent.packetId, amountCents: 5n });
    }
  });

  test("a repeated notice after a reconnect is delivered once", async () => {
    const sender = await login(server, "binary", 320);
    await shakeUntilWon(sender);
    const r = recorder();
    const user = (await login(server, "json", 321, { on: r.on, reconnect: { baseMs: 20 } })) as WsClient;
    const sent = await sender.send({ amountCents: 3, shares: 1, recipients: [321] });
    assert.ok(sent.result === "ok");
    await eventually("the notice", () => r.notices.length === 1 || undefined);
    // The server repeats unopened packets' notices at every login.
    user.dropConnection();
    await eventually("the reconnect", () => r.states.includes("reconnecting") && user.state === "open");
    await sleep(300);
    assert.equal(r.notices.length, 1);
  });

  test("a send in flight when the connection drops is sent again with its key: money moves once", async () => {
    for (const form of ["binary", "json"] as const) {
      const userId = form === "binary" ? 330 : 331;
      const r = recorder();
      const client = (await login(server, form, userId, { on: r.on, reconnect: { baseMs: 20 } })) as WsClient;
      const won = await shakeUntilWon(client);
      const pending = client.send({ amountCents: 7, shares: 1, recipients: [332] });
      client.dropConnection();
      const sent = await pending;
      assert.equal(sent.result, "ok", JSON.stringify(sent, bigints));
      assert.ok(r.states.includes("reconnecting"));
      assert.equal(await balanceOf(client), won.amountCents - 7n);
      // A shake in flight at a drop is not retried: its outcome is unknown.
      const shake = client.shake();
      client.dropConnection();
      await assert.rejects(shake, (e: Error & { kind?: string }) => e.kind === "connection-lost");
      await eventually("back online", () => client.state === "open");
    }
  });

  test("a replaced login kicks the older connection, which stays closed", async () => {
    const r = recorder();
    const kicks: string[] = [];
    const older = await login(server, "binary", 340, { on: { ...r.on, kick: (k) => kicks.push(k.reason) }, reconnect: { baseMs: 20 } });
    const newer = await login(server, "json", 340);
    await eventually("the kick", () => older.state === "closed");
    assert.deepEqual(kicks, ["replaced"]);
    await assert.rejects(older.shake(), (e: Error & { kind?: string }) => e.kind === "closed");
    await sleep(500);
    assert.equal(older.state, "closed");
    assert.ok(!r.states.includes("reconnecting"));
    assert.equal(newer.state, "open");
    assert.ok(["won", "nothing"].includes((await newer.shake()).result));
  });

  test("after its worker is killed the client reconnects and works again", async () => {
    const records = FORMS.map(() => recorder());
    const cs = await Promise.all(FORMS.map((form, i) => login(server, form, 350 + i, { on: records[i]!.on, reconnect: { baseMs: 50, maxMs: 1000 } })));
    const workers = server.workerPids();
    assert.equal(workers.length, 1, `one worker: ${workers}`);
    process.kill(workers[0]!, "SIGKILL");
    for (const [i, form] of FORMS.entries()) {
      if (form === "http") continue;
      await eventually(`${form} reconnect`, () => records[i]!.states.includes("reconnecting") && cs[i]!.state === "open", 30_000);
    }
    await eventually("a new worker", () => server.workerPids().some((pid) => pid !== workers[0]) || undefined, 30_000);
    for (const c of cs) {
      await balanceOf(c); // over HTTP: the first call finds the new worker (reads are retried)
      const won = await shakeUntilWon(c);
      assert.ok(won.amountCents > 0n);
      assert.ok((await balanceOf(c)) >= won.amountCents);
    }
  });

  test("the money audit holds", async () => {
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

describe("against an overloaded hongbao serve", { skip }, () => {
  let server: Server;

  before(async () => {
    // One shake a second is admitted; at most one connection not yet logged in.
    server = await startServer({ workers: 1, args: ["--max-shake-qps", "1"], config: "max_unauthenticated = 1\n" });
  });

  after(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.stop();
  });

  for (const [i, form] of FORMS.entries()) {
    test(`${form}: an overloaded shake holds shakes for the wait the server asked`, async () => {
      const client = await login(server, form, 400 + i);
      let overloaded: Extract<ShakeResult, { result: "overloaded" }> | undefined;
      for (let n = 0; n < 5 && !overloaded; n++) {
        const r = await client.shake();
        if (r.result === "overloaded") overloaded = r;
      }
      assert.ok(overloaded, "an overloaded answer within 5 shakes");
      assert.equal(overloaded.heldBack, false);
      const askedMs = overloaded.retryAfterMs;
      assert.ok(askedMs !== null && askedMs >= 1, `retry_after_ms ${askedMs}`);
      const held = client.shakeHeldForMs();
      assert.ok(held >= askedMs * 0.5 - 50 && held <= askedMs * 1.5, `held ${held} ms for ${askedMs} ms asked`);
      // Meanwhile the client answers shakes itself.
      if (held > 50) {
        const local = await client.shake();
        assert.equal(local.result, "overloaded");
        assert.ok(local.result === "overloaded" && local.heldBack && (local.retryAfterMs ?? 0) <= held);
      }
      // Once the wait is over, shakes go to the server again. (The server's wait doubles
      // while shedding goes on, up to 64 s: only a short one is waited out here.)
      if (client.shakeHeldForMs() <= 4000) {
        await sleep(client.shakeHeldForMs() + 5);
        const later = await client.shake();
        assert.ok(later.result !== "overloaded" || !later.heldBack, JSON.stringify(later, bigints));
      }
    });
  }

  test("a refused upgrade's Retry-After is waited out before reconnecting", async () => {
    // Hold the one unauthenticated connection the server allows, so the upgrade gets 503.
    const [host, port] = server.listen.split(":") as [string, string];
    const holder = net.connect({ host, port: Number(port) });
    await new Promise((r) => holder.once("connect", r));
    await sleep(100);
    setTimeout(() => holder.destroy(), 300);
    const started = Date.now();
    // random() = 0.5 draws exactly the mean: max(the back-off's 50 ms, Retry-After's 1 s).
    const client = await login(server, "binary", 420, { random: () => 0.5, reconnect: { baseMs: 50 } });
    const tookMs = Date.now() - started;
    assert.ok(tookMs >= 950, `connected after ${tookMs} ms: the 1 s Retry-After was not waited out`);
    assert.equal(client.state, "open");
  });

  test("the money audit holds", async () => {
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

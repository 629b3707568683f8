/**
 * The library against a real `hongbao serve` (started here; skipped with a message when
 * no binary is built): every flow over the WebSocket binary form, its JSON form and the
 * HTTP API — login, shake until a win, a send and its retry (money moves once), open,
 * chat, a notice waiting at login, a `replaced` kick, a reconnect after a worker is
 * killed, the waits an overloaded server asks for — then the server's money audit.
 *
 * Logins are JWTs minted here with the server's secret (`devToken`, as an app server
 * would). A third server ends sessions within seconds of their token
 * (`refresh_before_secs = 30`, `token_leeway_secs = 0`) for the token flows: a JWT naming
 * its user, refused tokens on the wire, a refresh through the app's callback on a live
 * connection, a session that lapses, a revocation, the HTTP bearer's refresh, the demo
 * login.
 */

import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, describe, test } from "node:test";

import { connect, devToken, type Client, type ConnectOptions, type PacketNotice, type ShakeResult } from "../src/node.js";
import type { ClientState } from "../src/events.js";
import { encode, decode } from "../src/frame.js";
import { fromJson, toJson } from "../src/json.js";
import { nodeSocket } from "../src/node-ws.js";
import type { Message } from "../src/protocol.js";
import type { CloseInfo } from "../src/socket.js";
import { tokenClaims } from "../src/token.js";
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

/** Logs in over a bare WebSocket with the package's codecs: every message until the close, and the close. */
function rawLogin(url: string, form: "binary" | "json", userId: bigint, token: string): Promise<{ messages: Message[]; close: CloseInfo }> {
  return new Promise((resolve) => {
    const messages: Message[] = [];
    const socket = nodeSocket(url, {
      open: () => {
        const frame = { requestId: 1, message: { type: "login" as const, userId, token: new TextEncoder().encode(token) } };
        socket.send(form === "json" ? toJson(frame) : encode(frame));
      },
      message: (data) => messages.push((typeof data === "string" ? fromJson(data) : decode(data)).message),
      close: (close) => resolve({ messages, close }),
    });
  });
}

describe("against a hongbao serve whose sessions end with their tokens", { skip }, () => {
  let server: Server;
  const WS_FORMS = ["binary", "json"] as const;
  const url = (form: Form) => (form === "http" ? server.http : server.ws);

  before(async () => {
    // A token minted to live 5 s is asked about within a second of the login (the
    // server's timers tick once a second), and ends with no leeway. Demo tokens on.
    server = await startServer({ workers: 1, args: ["--demo-login"], config: "refresh_before_secs = 30\ntoken_leeway_secs = 0\n" });
  });

  after(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.stop();
  });

  test("a JWT logs in as the user it names, with userId left out or given", async () => {
    const token = await devToken(TEST_SECRET, 501);
    for (const form of FORMS) {
      for (const userId of [undefined, 501]) {
        const client = await connect({ url: url(form), form: form === "json" ? "json" : "binary", token, userId, keepAliveMs: 0 });
        clients.push(client);
        assert.equal(client.userId, 501n, `${form}, userId ${userId}`);
        assert.equal((await client.ping()).result, "ok");
        const me = await client.me();
        assert.ok(me.result === "ok" && me.userId === 501n);
        await client.close();
      }
    }
    // The frame's user must be the token's.
    for (const form of WS_FORMS) {
      await assert.rejects(connect({ url: server.ws, form, token, userId: 502 }), (e: Error & { kind?: string }) => e.kind === "bad-token", form);
    }
  });

  test("a forged or expired token: login-reply bad-token, kick bad-token, the close; connect refuses it at once", async () => {
    const now = Math.floor(Date.now() / 1000);
    const refused = {
      forged: await devToken("not-the-secret", 511),
      expired: await devToken(TEST_SECRET, 511, { ttlSecs: 60, nowSecs: now - 120 }),
      "another kid": await devToken(TEST_SECRET, 511, { kid: "elsewhere" }),
      "not a JWT": "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70",
    };
    for (const [why, token] of Object.entries(refused)) {
      for (const form of WS_FORMS) {
        const { messages, close } = await rawLogin(server.ws, form, 0n, token);
        // The kick says why the token was refused (`bad token: expired`, ...).
        const kick = messages[1] as { text?: string } | undefined;
        assert.match(kick?.text ?? "", /^bad token: [a-z-]+$/, `${why} over ${form}`);
        assert.deepEqual(
          messages,
          [
            { type: "login-reply", result: "bad-token", userId: 0n },
            { type: "kick", reason: "bad-token", text: kick?.text },
          ],
          `${why} over ${form}`,
        );
        assert.equal(close.code, 1008, `${why} over ${form}`);
      }
      for (const form of FORMS) {
        const started = Date.now();
        await assert.rejects(
          connect({ url: url(form), form: form === "json" ? "json" : "binary", token }),
          (e: Error & { kind?: string }) => e.kind === "bad-token",
          `${why} over ${form}`,
        );
        assert.ok(Date.now() - started < 3000, "refused at once, not retried");
      }
      // The HTTP bearer: 401, `WWW-Authenticate: Bearer`, the reason in the body.
      const answer = await fetch(`${server.http}/v1/me`, { headers: { authorization: `Bearer ${token}` } });
      assert.equal(answer.status, 401);
      assert.equal(answer.headers.get("www-authenticate"), "Bearer");
      assert.equal((await answer.json()).result, "bad-token");
    }
  });

  test("a refresh through the app's callback keeps the session going past its first token", async () => {
    await Promise.all(
      WS_FORMS.map(async (form, i) => {
        const userId = 521 + i;
        const asked: bigint[] = [];
        const r = recorder();
        const kicks: string[] = [];
        const refreshes: bigint[] = [];
        const first = await devToken(TEST_SECRET, userId, { ttlSecs: 5 });
        const started = Date.now();
        const client = await connect({
          url: server.ws,
          form,
          token: first,
          keepAliveMs: 0,
          refresh: async (user) => {
            asked.push(user);
            await sleep(50); // the app server's round trip
            return devToken(TEST_SECRET, user); // an hour: no second refresh here
          },
          on: { ...r.on, kick: (k) => kicks.push(k.reason), refresh: (e) => refreshes.push(e.expiresAtMs) },
        });
        clients.push(client);
        await eventually(`${form}: the refresh push`, () => refreshes.length > 0 || undefined, 4000);
        assert.ok(Math.abs(Number(refreshes[0]!) - tokenClaims(first)!.expiresAtMs!) <= 1000, `${refreshes[0]}`);
        await eventually(`${form}: the fresh token taken`, () => client.token !== first || undefined, 4000);
        // Past the first token's end (5 s, no leeway), the same session still answers.
        await sleep(Math.max(0, 7000 - (Date.now() - started)));
        assert.equal((await client.ping()).result, "ok");
        assert.ok(["won", "nothing"].includes((await client.shake()).result));
        assert.deepEqual(asked, [BigInt(userId)], form);
        assert.deepEqual(kicks, [], form);
        assert.ok(!r.states.includes("reconnecting"), `${form}: ${r.states}`);
        assert.equal(client.state, "open");
      }),
    );
  });

  test("with no fresh token the session is kicked expired, and the client closes for good", async () => {
    const cases = [
      { form: "binary" as const, refresh: () => undefined, why: /gave no token/ },
      { form: "json" as const, refresh: undefined, why: /no refresh option/ },
    ];
    await Promise.all(
      cases.map(async ({ form, refresh, why }, i) => {
        const userId = 531 + i;
        const kicks: string[] = [];
        const states: { state: string; reason: string }[] = [];
        const client = await connect({
          url: server.ws,
          form,
          token: await devToken(TEST_SECRET, userId, { ttlSecs: 3 }),
          keepAliveMs: 0,
          refresh,
          on: { kick: (k) => kicks.push(k.reason), state: (s) => states.push(s) },
        });
        clients.push(client);
        await eventually(`${form}: the lapse`, () => client.state === "closed", 8000);
        assert.deepEqual(kicks, ["expired"], form);
        assert.match(states.at(-1)!.reason, why);
        await assert.rejects(client.ping(), (e: Error & { kind?: string }) => e.kind === "closed");
        await sleep(300);
        assert.equal(client.state, "closed");
      }),
    );
  });

  test("a revocation kicks the session, for good", async () => {
    const kicks: string[] = [];
    const client = await login(server, "binary", 541, { on: { kick: (k) => kicks.push(k.reason) } });
    const revoked = await server.adminPost("/v1/users/541/revoke", {});
    assert.equal(revoked.kicked, 1);
    await eventually("the kick", () => client.state === "closed");
    assert.deepEqual(kicks, ["revoked"]);
    await assert.rejects(client.shake(), (e: Error & { kind?: string }) => e.kind === "closed");
    // Tokens issued before it are refused (one of its very second too); later ones log in.
    const before = await devToken(TEST_SECRET, 541, { nowSecs: revoked.revoked_before - 1 });
    await assert.rejects(connect({ url: server.ws, token: before }), (e: Error & { kind?: string }) => e.kind === "bad-token");
    await sleep(Math.max(0, revoked.revoked_before * 1000 - Date.now()));
    assert.equal((await login(server, "json", 541)).state, "open");
  });

  test("http: the bearer is swapped for a fresh token before its end", async () => {
    const asked: bigint[] = [];
    const first = await devToken(TEST_SECRET, 551, { ttlSecs: 4 });
    const client = await connect({
      url: server.http,
      token: first,
      refreshBeforeMs: 1500,
      refresh: (user) => {
        asked.push(user);
        return devToken(TEST_SECRET, user);
      },
    });
    clients.push(client);
    assert.equal(client.userId, 551n);
    assert.equal((await client.me()).result, "ok");
    assert.deepEqual(asked, []); // the first token is good for a while yet
    await sleep(5000); // past its end
    const me = await client.me();
    assert.ok(me.result === "ok" && me.userId === 551n, JSON.stringify(me, bigints));
    assert.deepEqual(asked, [551n]);
    assert.notEqual(client.token, first);
    // Without a way to a fresh token, a request after the end is refused: 401, bad-token.
    const lapsing = await connect({ url: server.http, token: await devToken(TEST_SECRET, 552, { ttlSecs: 2 }) });
    clients.push(lapsing);
    await sleep(3000);
    const refused = await lapsing.me();
    assert.ok(refused.result === "refused" && refused.code === "bad-token", JSON.stringify(refused, bigints));
    // The app swaps one in itself.
    await lapsing.setToken(await devToken(TEST_SECRET, 552));
    assert.equal((await lapsing.me()).result, "ok");
  });

  test("setToken logs in again on a live connection; a refused one leaves the session as it was", async () => {
    for (const form of WS_FORMS) {
      const userId = form === "binary" ? 571 : 572;
      const client = await login(server, form, userId);
      const fresh = await devToken(TEST_SECRET, userId, { ttlSecs: 7200 });
      await client.setToken(fresh);
      assert.equal(client.token, fresh);
      await assert.rejects(client.setToken(await devToken("forged", userId)), (e: Error & { kind?: string }) => e.kind === "bad-token");
      assert.equal(client.token, fresh);
      assert.equal(client.state, "open");
      assert.equal((await client.ping()).result, "ok");
    }
  });

  test("the demo login hands out a JWT that logs in", async () => {
    const answer = await fetch(`${server.http}/token?user=561`);
    assert.equal(answer.status, 200);
    const demo = (await answer.json()) as { user_id: number; token: string };
    assert.deepEqual(Object.keys(demo).sort(), ["token", "user_id"]);
    assert.equal(demo.user_id, 561);
    assert.equal(tokenClaims(demo.token)?.userId, 561n);
    for (const form of FORMS) {
      const client = await connect({ url: url(form), form: form === "json" ? "json" : "binary", token: demo.token, keepAliveMs: 0 });
      clients.push(client);
      assert.equal(client.userId, 561n);
      assert.equal((await client.ping()).result, "ok");
      await client.close();
    }
  });

  test("the money audit holds", async () => {
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

describe("against a hongbao serve with tight per-user limits", { skip }, () => {
  let server: Server;

  before(async () => {
    // A shake a second, a chat a second, a login every two seconds, each a burst of one.
    const config = "[user_limits]\nshake = { per_sec = 1, burst = 1 }\nchat = { per_sec = 1, burst = 1 }\nlogin = { per_sec = 0.5, burst = 1 }\n";
    server = await startServer({ workers: 1, config });
  });

  after(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.stop();
  });

  for (const [i, form] of FORMS.entries()) {
    test(`${form}: a rate-limited answer carries its wait, and shakes are held for exactly that`, async () => {
      const client = await login(server, form, 601 + i);
      assert.ok(["won", "nothing"].includes((await client.shake()).result));
      const limited = await client.shake();
      assert.ok(limited.result === "rate-limited" && !limited.heldBack, JSON.stringify(limited));
      const waitMs = limited.retryAfterMs;
      assert.ok(waitMs !== null && waitMs > 0 && waitMs <= 1000, `${waitMs}`);
      const held = client.shakeHeldForMs();
      assert.ok(held > waitMs - 100 && held <= waitMs, `held ${held} ms for ${waitMs} ms`);
      // Meanwhile the client answers shakes itself; after the wait the server allows one.
      const local = await client.shake();
      assert.ok(local.result === "rate-limited" && local.heldBack, JSON.stringify(local));
      await sleep(client.shakeHeldForMs() + 5);
      assert.ok(["won", "nothing"].includes((await client.shake()).result));
      assert.equal((await client.chat(699, "one")).result, "offline");
      const chat = await client.chat(699, "two");
      assert.ok(chat.result === "rate-limited" && chat.retryAfterMs !== null && chat.retryAfterMs > 0, JSON.stringify(chat));
      assert.match(chat.text, /limit/);
    });
  }

  test("a rate-limited login is tried again once its wait is over", async () => {
    for (const form of ["binary", "json"] as const) {
      const userId = form === "binary" ? 611 : 612;
      await (await login(server, form, userId)).close();
      const started = Date.now();
      const again = await login(server, form, userId, { reconnect: { baseMs: 20 } });
      assert.equal(again.state, "open");
      assert.ok(Date.now() - started >= 1000, `logged in again after ${Date.now() - started} ms: the login limit was not waited out`);
    }
  });

  test("the money audit holds", async () => {
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

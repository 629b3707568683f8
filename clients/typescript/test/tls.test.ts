/**
 * The library against a `hongbao serve` that speaks TLS on every listener (`--tls-cert`,
 * `--tls-key`; certificates made here with `openssl`, skipped with a message without
 * it): the main flow over `wss://` (binary and JSON) and `https://` with the test CA in
 * `ca`; a client trusting another CA, or Node's own list, stops at once with kind `tls`
 * and never reconnects; a plain `ws://` or `http://` URL at a TLS port does the same.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { connect, devToken, type Client, type ClientState, type ConnectOptions, type PacketNotice } from "../src/node.js";
import { makeCerts, noOpenssl, type TestCerts } from "./support/certs.js";
import { NO_BINARY_MESSAGE, TEST_SECRET, hongbaoBinary, startServer, type Server } from "./support/server.js";

const skip = hongbaoBinary() === undefined ? NO_BINARY_MESSAGE : noOpenssl();
const FORMS = ["binary", "json", "http"] as const;
type Form = (typeof FORMS)[number];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function bigints(_key: string, value: unknown): unknown {
  return typeof value === "bigint" ? value.toString() : value;
}

describe("against a hongbao serve speaking TLS", { skip }, () => {
  let certs: TestCerts;
  let server: Server;
  const clients: Client[] = [];

  const urlOf = (form: Form) => (form === "http" ? server.http : server.ws);

  async function login(form: Form, userId: number, extra: Partial<ConnectOptions> = {}): Promise<Client> {
    const client = await connect({
      url: urlOf(form),
      form: form === "json" ? "json" : "binary",
      userId,
      token: await devToken(TEST_SECRET, userId),
      ca: certs.caPem,
      keepAliveMs: 0,
      ...extra,
    });
    clients.push(client);
    return client;
  }

  before(async () => {
    certs = makeCerts();
    server = await startServer({ workers: 1, tls: certs });
    await server.adminPost("/v1/campaigns/shake", { packets: 2000, rate_per_sec: 2000, amount_min: 100, amount_max: 500 });
  });

  after(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.stop();
    certs?.remove();
  });

  for (const [i, form] of FORMS.entries()) {
    test(`${form} over ${form === "http" ? "https" : "wss"}://: login, shake until a win, send with a key, open`, async () => {
      assert.match(urlOf(form), form === "http" ? /^https:\/\// : /^wss:\/\//);
      const [sender, recipient] = [700 + i * 10, 701 + i * 10];
      const notices: PacketNotice[] = [];
      const s = await login(form, sender);
      const r = await login(form, recipient, { on: { "packet-notice": (n) => notices.push(n) } });
      assert.equal(s.state, "open");
      assert.equal((await s.ping()).result, "ok");

      let won;
      for (let tries = 0; tries < 400 && won === undefined; tries++) {
        const shake = await s.shake();
        if (shake.result === "won") won = shake;
        else assert.equal(shake.result, "nothing", JSON.stringify(shake, bigints));
        await sleep(20);
      }
      assert.ok(won !== undefined, "no win in 400 shakes");
      // me() goes over https:// for a WebSocket client too (the same gateway's HTTP API).
      const me = await s.me();
      assert.ok(me.result === "ok" && me.balanceCents === won.amountCents, JSON.stringify(me, bigints));

      const request = { amountCents: 40, shares: 1, recipients: [recipient], idempotencyKey: `ts-tls-${form}-${Date.now()}` };
      const sent = await s.send(request);
      assert.equal(sent.result, "ok", JSON.stringify(sent, bigints));
      assert.deepEqual(await s.send(request), sent);
      if (sent.result !== "ok") return;
      assert.equal(sent.balanceCents, won.amountCents - 40n);

      if (form === "http") await r.notices();
      const deadline = Date.now() + 10_000;
      while (!notices.some((n) => n.packetId === sent.packetId) && Date.now() < deadline) await sleep(25);
      assert.ok(notices.some((n) => n.packetId === sent.packetId), "the recipient's notice");
      assert.deepEqual(await r.open(sent.packetId), { result: "opened", packetId: sent.packetId, amountCents: 40n });
      assert.equal((await r.open(sent.packetId)).result, "already-opened");
    });
  }

  /** Connects expecting a `tls` refusal: fast, with no reconnect on the way. */
  async function refusedForTls(options: Omit<ConnectOptions, "token">, pattern: RegExp): Promise<void> {
    const states: ClientState[] = [];
    const started = Date.now();
    await assert.rejects(
      connect({ token: await devToken(TEST_SECRET, 790), keepAliveMs: 0, ...options, on: { state: (s) => states.push(s.state) } }),
      (e: Error & { kind?: string }) => {
        assert.equal(e.kind, "tls", `${options.url}: ${e.kind}: ${e.message}`);
        assert.match(e.message, pattern);
        return true;
      },
    );
    // Not retried until the connect timeout (15 s): refused at the first try.
    assert.ok(Date.now() - started < 3000, `${options.url}: refused after ${Date.now() - started} ms`);
    assert.ok(!states.includes("reconnecting"), `${options.url}: states ${states}`);
  }

  test("a client trusting another CA (or only Node's own) stops at once with kind tls", async () => {
    for (const form of FORMS) {
      const form_ = form === "json" ? "json" : "binary";
      await refusedForTls({ url: urlOf(form), form: form_, ca: certs.otherCaPem }, /certificate is not trusted/);
      await refusedForTls({ url: urlOf(form), form: form_ }, /certificate is not trusted/);
    }
  });

  test("a plain ws:// or http:// URL at a TLS port stops at once with kind tls", async () => {
    await refusedForTls({ url: server.ws.replace(/^wss:/, "ws:") }, /speaks TLS on this address \(use wss:\/\/\)/);
    await refusedForTls({ url: server.ws.replace(/^wss:/, "ws:"), form: "json" }, /speaks TLS/);
    await refusedForTls({ url: server.http.replace(/^https:/, "http:") }, /speaks TLS on this address \(use https:\/\/\)/);
  });

  test("the money audit holds", async () => {
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

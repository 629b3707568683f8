/**
 * The browser bundle (dist/browser/hongbao-client.js) in headless Chromium, against a
 * live `hongbao serve`: a page served from loopback imports the bundle, mints its JWTs
 * with WebCrypto (`devToken`, standing in for the app server), and runs the main flow —
 * login (the binary form naming the user; the JSON form with the token alone and a
 * `refresh` callback), shake until a win, send with a key and retry it, the recipient's
 * notice and open; then a login and a shake with the classic-script build — and posts
 * what happened back to the test's own HTTP server. Skipped with a message when Chromium
 * or the hongbao binary is missing.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server as HttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { packageRoot } from "./support/repo.js";
import { NO_BINARY_MESSAGE, TEST_SECRET, hongbaoBinary, startServer, type Server } from "./support/server.js";

const CHROMIUM = process.env["CHROMIUM"] ?? ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"].find(existsSync);
const skip =
  hongbaoBinary() === undefined
    ? NO_BINARY_MESSAGE
    : CHROMIUM === undefined
      ? "no Chromium (apt-get install chromium, or set CHROMIUM) to run the browser test"
      : false;

const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>running</title>
<script src="/hongbao-client.iife.js"></script>
<script type="module">
import { connect, devToken } from "/hongbao-client.js";

const q = new URLSearchParams(location.search);
const ws = q.get("ws");
const secret = q.get("secret");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const plain = (v) => JSON.parse(JSON.stringify(v, (_, x) => (typeof x === "bigint" ? String(x) : x)));
const report = (result) => fetch("/result", { method: "POST", body: JSON.stringify(plain(result)) });

try {
  const sender = 9001, recipient = 9002;
  const notices = [];
  const a = await connect({ url: ws, userId: sender, token: await devToken(secret, sender) });
  const b = await connect({
    url: ws, form: "json", token: await devToken(secret, recipient),
    refresh: (user) => devToken(secret, user),
    on: { "packet-notice": (n) => notices.push(n) },
  });
  const recipientUserId = b.userId;
  let won;
  for (let i = 0; i < 400 && !won; i++) {
    const r = await a.shake();
    if (r.result === "won") won = r;
    else await sleep(20);
  }
  if (!won) throw new Error("no win in 400 shakes");
  const sent = await a.send({ amountCents: 10, shares: 1, recipients: [recipient] });
  const again = await a.send({ amountCents: 10, shares: 1, recipients: [recipient], idempotencyKey: sent.idempotencyKey });
  for (let i = 0; i < 200 && !notices.some((n) => n.packetId === sent.packetId); i++) await sleep(25);
  const notice = notices.find((n) => n.packetId === sent.packetId);
  const opened = await b.open(sent.packetId);
  const pong = await a.ping();
  await a.close();
  await b.close();
  // The classic-script build (globalThis.hongbao), as a self-contained page would inline it.
  const c = await hongbao.connect({ url: ws, userId: 9003, token: await hongbao.devToken(secret, 9003) });
  const iife = { shake: (await c.shake()).result, state: c.state };
  await c.close();
  await report({ ok: true, won, sent, again, notice, opened, pong: pong.result, iife, recipientUserId, isSecure: isSecureContext });
} catch (e) {
  await report({ ok: false, error: String(e && e.stack || e) });
}
document.title = "done";
</script>`;

describe("the browser bundle in headless Chromium", { skip }, () => {
  let server: Server;
  let web: HttpServer;
  let results: (result: unknown) => void;
  const result = new Promise<any>((resolve) => (results = resolve));

  before(async () => {
    server = await startServer({ workers: 1 });
    await server.adminPost("/v1/campaigns/shake", { packets: 500, rate_per_sec: 1000, amount_min: 100, amount_max: 500 });
    const bundle = readFileSync(join(packageRoot(), "dist", "browser", "hongbao-client.js"));
    const iife = readFileSync(join(packageRoot(), "dist", "browser", "hongbao-client.iife.js"));
    web = createServer((req, res) => {
      if (req.url?.startsWith("/index.html")) {
        res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" }).end(PAGE);
      } else if (req.url === "/hongbao-client.js") {
        res.writeHead(200, { "Content-Type": "text/javascript" }).end(bundle);
      } else if (req.url === "/hongbao-client.iife.js") {
        res.writeHead(200, { "Content-Type": "text/javascript" }).end(iife);
      } else if (req.url === "/result" && req.method === "POST") {
        let body = "";
        req.on("data", (c: Buffer) => (body += c.toString()));
        req.on("end", () => {
          res.writeHead(204).end();
          results(JSON.parse(body));
        });
      } else {
        res.writeHead(404).end();
      }
    });
    await new Promise<void>((r) => web.listen(0, "127.0.0.1", r));
  });

  after(async () => {
    await new Promise((r) => web?.close(r));
    await server?.stop();
  });

  test("logs in, shakes until a win, sends with a key and retries it, opens", async () => {
    const port = (web.address() as AddressInfo).port;
    const url = `http://127.0.0.1:${port}/index.html?ws=${encodeURIComponent(server.ws)}&secret=${encodeURIComponent(TEST_SECRET)}`;
    const profile = mkdtempSync(join(tmpdir(), "hongbao-chromium-"));
    // Its own process group, so that the renderer and helpers go with it at the end.
    const chromium = spawn(
      CHROMIUM!,
      ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", `--user-data-dir=${profile}`, url],
      { detached: true, stdio: "ignore" },
    );
    try {
      const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("no result from the page within 60 s")), 60_000).unref());
      const r = await Promise.race([result, timeout]);
      assert.equal(r.ok, true, r.error);
      assert.equal(r.isSecure, true);
      assert.equal(r.won.result, "won");
      assert.ok(BigInt(r.won.amountCents) >= 100n);
      assert.equal(r.sent.result, "ok");
      assert.deepEqual(r.again, r.sent, "the retry with the same key gets the first answer");
      assert.equal(r.notice.packetId, r.sent.packetId);
      assert.equal(r.notice.fromUser, "9001");
      assert.deepEqual(r.opened, { result: "opened", packetId: r.sent.packetId, amountCents: "10" });
      assert.equal(r.pong, "ok");
      assert.equal(r.recipientUserId, "9002", "the user the token named");
      assert.ok(["won", "nothing"].includes(r.iife.shake), JSON.stringify(r.iife));
      assert.equal(r.iife.state, "open");
      const me = await server.adminGet("/v1/users/9001");
      assert.equal(BigInt(me.balance_cents), BigInt(r.won.amountCents) - 10n, "money moved once");
    } finally {
      try {
        process.kill(-chromium.pid!, "SIGKILL");
      } catch {
        // already gone
      }
      rmSync(profile, { recursive: true, force: true });
    }
    const audit = await server.adminGet("/v1/audit");
    assert.equal(audit.ok, true, JSON.stringify(audit));
  });
});

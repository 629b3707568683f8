/**
 * The pure pieces: the JSON form against docs/protocol.md's examples, the exact JSON
 * reader, the JWT minter against golden.txt's login token (and an HMAC computed apart),
 * the credentials' refresh rules, back-off arithmetic, notice memory, which errors are TLS
 * failures no retry mends.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { createHmac } from "node:crypto";

import { Backoff, ShakeGate, jittered } from "../src/backoff.js";
import { Credentials } from "../src/credentials.js";
import { SeenPackets } from "../src/events.js";
import { decode, encode } from "../src/frame.js";
import { JsonFormError, fromJson, parseJson, stringifyJson, toJson } from "../src/json.js";
import { toU64 } from "../src/numbers.js";
import { newIdempotencyKey } from "../src/platform.js";
import { validIdempotencyKey } from "../src/protocol.js";
import { connect as browserConnect } from "../src/index.js";
import { isTlsAlert, tlsFailureOf } from "../src/tls-failure.js";
import { DEV_SECRET, base64url, devToken, tokenClaims, unbase64url } from "../src/token.js";
import { repoRoot } from "./support/repo.js";

/** The JSON lines of protocol.md's "Examples, one of each type" block. */
function protocolJsonExamples(): string[] {
  const doc = readFileSync(join(repoRoot(), "docs", "protocol.md"), "utf8");
  const at = doc.indexOf("Examples, one of each type");
  assert.ok(at >= 0, "protocol.md has its JSON examples");
  const block = doc.slice(doc.indexOf("```json", at) + 7, doc.indexOf("```", doc.indexOf("```json", at) + 7));
  return block.split("\n").filter((l) => l.trim() !== "");
}

describe("JSON form", () => {
  test("every example in docs/protocol.md reads and writes back byte for byte", () => {
    const examples = protocolJsonExamples();
    assert.ok(examples.length >= 18);
    const types = new Set<string>();
    for (const line of examples) {
      const frame = fromJson(line);
      types.add(frame.message.type);
      assert.equal(toJson(frame), line);
      // And the binary form carries the same message.
      assert.deepEqual(decode(encode(frame)), frame);
    }
    assert.equal(types.size, 18, "one of each type");
  });

  test("u64s above 2^53 are exact", () => {
    const line = '{"type":"packet_notice","id":0,"packet_id":18446744073709551615,"from_user":9007199254740993,"amount_cents":1,"shares":1,"expires_at_ms":2}';
    const frame = fromJson(line);
    assert.equal(frame.message.type === "packet-notice" && frame.message.packetId, 18446744073709551615n);
    assert.equal(frame.message.type === "packet-notice" && frame.message.fromUser, 9007199254740993n);
    assert.equal(toJson(frame), line);
  });

  test("refuses what json.rs refuses, naming the request", () => {
    const bad: [string, number | undefined][] = [
      ['{"type":"open","id":9}', 9],
      ['{"type":"open","id":9,"packet_id":-1}', 9],
      ['{"type":"open","id":9,"packet_id":1.5}', 9],
      ['{"type":"open","id":9,"packet_id":18446744073709551616}', 9],
      ['{"type":"chat_reply","id":3,"result":"great"}', 3],
      ['{"type":"kick","id":0,"reason":"bored","text":""}', 0],
      ['{"type":"nope","id":4}', 4],
      ['{"type":"shake","id":4294967296}', undefined],
      ["[1,2]", undefined],
      ["{", undefined],
    ];
    for (const [line, id] of bad) {
      assert.throws(() => fromJson(line), (e: JsonFormError) => e instanceof JsonFormError && e.requestId === id, line);
    }
  });

  test("the reader handles escapes, nesting and whitespace like JSON.parse", () => {
    const text = ' { "a" : [ 1 , -2.5 , 3e2 , true , false , null , "x\\u00e9\\ud83e\\udde7\\n\\"" ] , "b" : { } , "c" : [ ] } ';
    const ours = parseJson(text);
    assert.deepEqual(ours, { a: [1n, -2.5, 300, true, false, null, 'xé🧧\n"'], b: {}, c: [] });
    assert.equal(stringifyJson(ours), '{"a":[1,-2.5,300,true,false,null,"xé🧧\\n\\""],"b":{},"c":[]}');
    for (const broken of ['{"a":1,}', "[01]", '"\\x"', '{"a" 1}', "tru", '"a\nb"', "1 2"]) {
      assert.throws(() => parseJson(broken), SyntaxError, broken);
    }
  });
});

/** golden.txt's login token, less its (made-up) signature: user 42, issued at 1,800,000,000 for an hour. */
const GOLDEN_SIGNING_INPUT =
  "eyJhbGciOiJIUzI1NiIsImtpZCI6ImhvbmdiYW8iLCJ0eXAiOiJKV1QifQ" + ".eyJzdWIiOiI0MiIsImV4cCI6MTgwMDAwMzYwMCwiaWF0IjoxODAwMDAwMDAwfQ";

const b64json = (part: string) => JSON.parse(new TextDecoder().decode(unbase64url(part)));

describe("tokens: HS256 JWTs", () => {
  test("golden.txt's login token: its header and claims, and the signature openssl gives", async () => {
    const token = await devToken(DEV_SECRET, 42, { nowSecs: 1_800_000_000 });
    // `openssl dgst -sha256 -hmac hongbao-dev-secret`, base64url; the Python suite pins the same token.
    assert.equal(token, `${GOLDEN_SIGNING_INPUT}.q_oSwQVlYQsKlNWFypNI9SvATV5SlMzQyDliLrgFenw`);
  });

  test("HMAC-SHA256 over header.claims, base64url without padding", async () => {
    const token = await devToken("k", 18446744073709551615n, { ttlSecs: 60, nowSecs: 1_700_000_000, kid: "app-2", audience: "hongbao" });
    const [header, claims, signature] = token.split(".") as [string, string, string];
    assert.deepEqual(b64json(header), { alg: "HS256", kid: "app-2", typ: "JWT" });
    assert.deepEqual(b64json(claims), { sub: "18446744073709551615", exp: 1_700_000_060, iat: 1_700_000_000, aud: "hongbao" });
    const expected = createHmac("sha256", "k").update(`${header}.${claims}`).digest("base64url");
    assert.equal(signature, expected);
    assert.ok(!token.includes("=") && /^[\x21-\x7e]+$/.test(token));
    // WebCrypto refuses an empty key: one zero byte is the same HMAC key.
    const empty = await devToken("", 1, { nowSecs: 1 });
    const [h, c, sig] = empty.split(".") as [string, string, string];
    assert.equal(sig, createHmac("sha256", "").update(`${h}.${c}`).digest("base64url"));
    await assert.rejects(devToken("k", 0), RangeError);
  });

  test("base64url both ways, every length", () => {
    for (let n = 0; n < 40; n++) {
      const bytes = Uint8Array.from({ length: n }, (_, i) => (i * 89 + n * 7) & 0xff);
      assert.equal(base64url(bytes), Buffer.from(bytes).toString("base64url"), `${n} bytes`);
      assert.deepEqual(unbase64url(base64url(bytes)), bytes, `${n} bytes`);
    }
    assert.throws(() => unbase64url("a+b"), SyntaxError);
  });

  test("claims are read without the key; anything else is no token", async () => {
    const token = await devToken("s", 42, { ttlSecs: 600, nowSecs: 1_800_000_000 });
    const claims = tokenClaims(token);
    assert.equal(claims?.userId, 42n);
    assert.equal(claims?.expiresAtMs, 1_800_000_600_000);
    for (const notJwt of ["", "abc", "a.b.c", "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70"]) {
      assert.equal(tokenClaims(notJwt), undefined, notJwt);
    }
  });
});

describe("credentials", () => {
  const nowSecs = () => Math.floor(Date.now() / 1000);

  test("the user: as given, else the token's", async () => {
    const token = await devToken("s", 42);
    assert.equal(new Credentials(token, 0n, undefined, 60_000).userId, 42n);
    assert.equal(new Credentials(token, 0n, undefined, 60_000).loginUserId, 0n);
    assert.equal(new Credentials(token, 42n, undefined, 60_000).loginUserId, 42n);
    assert.equal(new Credentials("opaque", 0n, undefined, 60_000).userId, 0n);
  });

  test("a login swaps a token only once it has ended; a request once it is near its end", async () => {
    const asked: bigint[] = [];
    const refresh = async (user: bigint) => {
      asked.push(user);
      return `fresh-${asked.length}`;
    };
    const ending = await devToken("s", 7, { ttlSecs: 30 });
    const c = new Credentials(ending, 0n, refresh, 60_000);
    assert.equal(await c.forLogin(), ending);
    assert.deepEqual(asked, []);
    assert.equal(await c.forRequest(), "fresh-1"); // 30 s left, under the 60 s margin
    assert.deepEqual(asked, [7n]);
    const ended = new Credentials(await devToken("s", 8, { ttlSecs: 60, nowSecs: nowSecs() - 120 }), 0n, refresh, 0);
    assert.equal(await ended.forLogin(), "fresh-2");
    assert.equal(ended.token, "fresh-2");
    // A token with no readable end is used as it is.
    assert.equal(await new Credentials("opaque", 9n, refresh, 60_000).forRequest(), "opaque");
  });

  test("callers asking together share one call; a callback that gives nothing says why", async () => {
    let calls = 0;
    const c = new Credentials("t", 1n, async () => {
      calls++;
      await new Promise((r) => setTimeout(r, 10));
      return "fresh";
    }, 0);
    assert.deepEqual(await Promise.all([c.ask(), c.ask(), c.ask()]), ["fresh", "fresh", "fresh"]);
    assert.equal(calls, 1);
    const none = new Credentials("t", 1n, () => undefined, 0);
    assert.equal(await none.ask(), undefined);
    assert.match(none.lastFailure ?? "", /gave no token/);
    const failing = new Credentials("t", 1n, () => {
      throw new Error("the app server is down");
    }, 0);
    assert.equal(await failing.ask(), undefined);
    assert.match(failing.lastFailure ?? "", /the app server is down/);
    assert.equal(await new Credentials("t", 1n, undefined, 0).ask(), undefined);
  });
});

describe("numbers", () => {
  test("a number goes in only if it is a safe integer", () => {
    assert.equal(toU64(42, "x"), 42n);
    assert.equal(toU64(2n ** 64n - 1n, "x"), 2n ** 64n - 1n);
    assert.throws(() => toU64(2 ** 53, "x"), RangeError);
    assert.throws(() => toU64(-1, "x"), RangeError);
    assert.throws(() => toU64(1.5, "x"), RangeError);
    assert.throws(() => toU64(2n ** 64n, "x"), RangeError);
  });

  test("idempotency keys made here are valid keys", () => {
    const a = newIdempotencyKey();
    assert.ok(validIdempotencyKey(a));
    assert.notEqual(a, newIdempotencyKey());
    assert.ok(!validIdempotencyKey("a b") && !validIdempotencyKey("") && !validIdempotencyKey("x".repeat(65)));
  });
});

describe("back-off", () => {
  test("a jittered wait is drawn from ½× to 1½× of its mean", () => {
    assert.equal(jittered(1000, () => 0), 500);
    assert.equal(jittered(1000, () => 0.999999), 1500);
  });

  test("full jitter: a wait is drawn from [0, window), the window doubling from the base to the cap", () => {
    const top = new Backoff(500, 30_000, () => 0.999999);
    const draws = Array.from({ length: 9 }, () => top.next());
    assert.deepEqual(draws, [499, 999, 1999, 3999, 7999, 15_999, 29_999, 29_999, 29_999]);
    assert.equal(top.attempts, 9);
    const bottom = new Backoff(500, 30_000, () => 0);
    assert.deepEqual([bottom.next(), bottom.next(), bottom.next()], [0, 0, 0]);
    // Any draw lies in its window, and the window never passes the cap.
    const any = new Backoff(500, 30_000, Math.random);
    for (let i = 0; i < 200; i++) {
      const window = any.windowMs();
      const wait = any.next();
      assert.ok(window <= 30_000 && wait >= 0 && wait < window, `${wait} in [0, ${window})`);
    }
    top.reset();
    assert.equal(top.attempts, 0);
    assert.equal(top.next(), 499);
  });

  test("a hint is drawn from ½× to 1½× of it and does not count; a per-user limit is a floor", () => {
    const b = new Backoff(500, 30_000, () => 0);
    assert.equal(b.next(2500), 1250);
    assert.equal(new Backoff(500, 30_000, () => 0.999999).next(2500), 3750);
    assert.equal(b.attempts, 0, "the hint did not count");
    b.next();
    assert.equal(b.attempts, 1);
    assert.equal(b.next(40_000), 20_000, "a hint is the server's word: not capped");
    // A per-user limit's wait is a floor, whatever the jitter draws.
    assert.equal(new Backoff(250, 2000, () => 0).next(undefined, 900), 900);
    assert.equal(new Backoff(250, 2000, () => 0).next(4000, 4000), 4000);
  });

  test("the shake gate holds shakes for the server's wait, or 30 s when it named none", () => {
    const gate = new ShakeGate(() => 0.5);
    assert.equal(gate.heldForMs(0), 0);
    gate.overloaded(2000, 1000);
    assert.equal(gate.heldForMs(1000), 2000);
    assert.equal(gate.heldForMs(2500), 500);
    assert.equal(gate.heldForMs(3000), 0);
    gate.overloaded(null, 10_000);
    assert.equal(gate.heldForMs(10_000), 30_000);
    assert.equal(gate.heldBy, "overloaded");
  });

  test("a rate-limited shake holds shakes for exactly the wait named", () => {
    const gate = new ShakeGate(() => 0); // a jittered wait would be half
    gate.rateLimited(700, 1000);
    assert.equal(gate.heldForMs(1000), 700);
    assert.equal(gate.heldBy, "rate-limited");
    gate.overloaded(100, 1000); // shorter: the longer wait stands
    assert.equal(gate.heldForMs(1000), 700);
    assert.equal(gate.heldBy, "rate-limited");
  });
});

describe("notice memory", () => {
  test("a packet is announced once, and the memory is bounded", () => {
    const seen = new SeenPackets(3);
    assert.deepEqual([1n, 2n, 1n, 3n, 2n].map((id) => seen.firstTime(id)), [true, true, false, true, false]);
    seen.firstTime(4n); // forgets 1
    assert.equal(seen.firstTime(1n), true);
    assert.equal(seen.firstTime(4n), false);
  });
});

describe("TLS failures", () => {
  const coded = (code: string, message: string, extra: object = {}) => Object.assign(new Error(message), { code, ...extra });

  test("certificate and handshake failures are TLS failures, in the error or its cause", () => {
    const leaf = coded("UNABLE_TO_VERIFY_LEAF_SIGNATURE", "unable to verify the first certificate");
    assert.match(tlsFailureOf(leaf, "wss://")!, /certificate is not trusted \(UNABLE_TO_VERIFY_LEAF_SIGNATURE: unable to verify/);
    // undici's fetch: TypeError("fetch failed") with the socket's error as its cause.
    const wrapped = new TypeError("fetch failed", { cause: coded("ERR_TLS_CERT_ALTNAME_INVALID", "Hostname/IP does not match") });
    assert.match(tlsFailureOf(wrapped, "https://")!, /certificate is not trusted \(ERR_TLS_CERT_ALTNAME_INVALID/);
    const alpn = coded("ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL", "80DC:error:0A000460:SSL routines\nmore", {
      reason: "tlsv1 alert no application protocol",
    });
    assert.equal(tlsFailureOf(alpn, "wss://"), "the TLS handshake failed (ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL: tlsv1 alert no application protocol)");
    // node:https at a plain port: OpenSSL's refusal as a write error.
    const eproto = coded("EPROTO", "write EPROTO 808C:error:0A00010B:SSL routines:ssl3_get_record:wrong version number:../ssl3_record.c:350:");
    assert.equal(tlsFailureOf(eproto, "https://"), "the TLS handshake failed (EPROTO: wrong version number)");
    assert.equal(tlsFailureOf(coded("EPROTO", "read EPROTO"), "https://"), undefined);
  });

  test("an HTTP parser choking on a TLS alert is a plain client at a TLS port", () => {
    const undici = new TypeError("fetch failed", { cause: coded("HPE_INVALID_CONSTANT", "Expected HTTP/", { data: "\x15\x03\x03\x00\x02\x022" }) });
    assert.match(tlsFailureOf(undici, "https://")!, /speaks TLS on this address \(use https:\/\/\)/);
    const nodeHttp = coded("HPE_INVALID_CONSTANT", "Parse Error", { rawPacket: Buffer.from([0x15, 0x03, 0x03, 0, 2, 2, 0x32]) });
    assert.match(tlsFailureOf(nodeHttp, "https://")!, /speaks TLS/);
    // Another answer that is not HTTP is not a TLS failure: a retry may find the server.
    assert.equal(tlsFailureOf(coded("HPE_INVALID_CONSTANT", "Expected HTTP/", { data: "SSH-2.0" }), "https://"), undefined);
  });

  test("lost connections are not TLS failures", () => {
    for (const code of ["ECONNRESET", "ECONNREFUSED", "EPIPE", "UND_ERR_SOCKET"]) {
      assert.equal(tlsFailureOf(new TypeError("fetch failed", { cause: coded(code, "gone") }), "https://"), undefined, code);
    }
    assert.equal(tlsFailureOf(new Error("Client network socket disconnected before secure TLS connection was established"), "wss://"), undefined);
    assert.equal(tlsFailureOf(undefined, "wss://"), undefined);
  });

  test("a TLS alert record, and nothing else, is recognised", () => {
    assert.ok(isTlsAlert(new Uint8Array([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])));
    assert.ok(!isTlsAlert(new Uint8Array([0x00, 0x00, 0x00, 0x0a, 0x02])), "a frame's length prefix");
    assert.ok(!isTlsAlert("HTTP/1.1 101"));
    assert.ok(!isTlsAlert(new Uint8Array([0x15])));
  });

  test("the browser entry refuses a ca: a browser trusts what it trusts", async () => {
    await assert.rejects(browserConnect({ url: "wss://127.0.0.1:1/ws", token: "t", ca: "PEM" }), TypeError);
    await assert.rejects(browserConnect({ url: "https://127.0.0.1:1", token: "t", ca: "PEM" }), /Node only/);
  });
});

/**
 * The pure pieces: the JSON form against docs/protocol.md's examples, the exact JSON
 * reader, tokens against token.rs's vectors, back-off arithmetic, notice memory.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { Backoff, ShakeGate, jittered } from "../src/backoff.js";
import { SeenPackets } from "../src/events.js";
import { decode, encode } from "../src/frame.js";
import { JsonFormError, fromJson, parseJson, stringifyJson, toJson } from "../src/json.js";
import { toU64 } from "../src/numbers.js";
import { newIdempotencyKey } from "../src/platform.js";
import { validIdempotencyKey } from "../src/protocol.js";
import { devToken } from "../src/token.js";
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
    assert.ok(examples.length >= 17);
    const types = new Set<string>();
    for (const line of examples) {
      const frame = fromJson(line);
      types.add(frame.message.type);
      assert.equal(toJson(frame), line);
      // And the binary form carries the same message.
      assert.deepEqual(decode(encode(frame)), frame);
    }
    assert.equal(types.size, 17, "one of each type");
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

describe("tokens (token.rs's vectors)", () => {
  test("HMAC-SHA256 of the decimal user id", async () => {
    assert.equal(await devToken("secret", 42), "93c121e7aa437a1e01e3c512c6f0ce3c821a839025dca4408f85616de4aaee70");
    assert.equal(await devToken("", 0), "9979e4c3ee19965f9ecc6dca6b3954b10c18c1bfa105c512cc3ae58be85db71c");
    assert.equal(await devToken("k", 18446744073709551615n), "ce4b782bd2451af0e0ba523cabb2b5b585eaa7c4f1afc53d89cb4ac4db192ea9");
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
  test("a wait is drawn from ½× to 1½× of its mean", () => {
    assert.equal(jittered(1000, () => 0), 500);
    assert.equal(jittered(1000, () => 0.999999), 1500);
  });

  test("reconnect delays double to the cap, never below what the server asked, and reset", () => {
    const b = new Backoff(250, 2000, () => 0.5);
    assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next()], [250, 500, 1000, 2000, 2000]);
    assert.equal(b.next(5000), 5000);
    b.reset();
    assert.equal(b.next(), 250);
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

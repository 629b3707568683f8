/**
 * Conformance: every vector of crates/proto/testdata/golden.txt, both directions. A
 * valid vector's hex decodes to exactly its decoded form and its decoded form encodes to
 * exactly its hex (and survives the JSON form unchanged); an invalid one is refused with
 * the named error kind — by `check` from the header alone where the kind is fatal, by
 * `decode` otherwise. The test iterates the file: a new vector needs no new code here.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { FrameError, check, decode, encode } from "../src/frame.js";
import { fromJson, hex, toJson, unhex } from "../src/json.js";
import { TYPE_CODES } from "../src/protocol.js";
import { formatFrame, parseDecoded, parseGolden } from "./support/golden.js";
import { repoRoot } from "./support/repo.js";

const goldenPath = join(repoRoot(), "crates", "proto", "testdata", "golden.txt");
const vectors = parseGolden(readFileSync(goldenPath, "utf8"));

/** The error kind the bytes are refused with, or undefined if they decode. */
function refusal(bytes: Uint8Array): string | undefined {
  try {
    const whole = check(bytes);
    if (whole === undefined) return "incomplete";
    decode(bytes.subarray(0, whole));
    return whole === bytes.length ? undefined : "trailing-bytes";
  } catch (e) {
    if (e instanceof FrameError) return e.kind;
    throw e;
  }
}

describe("golden.txt", () => {
  test("has vectors of both kinds", () => {
    assert.ok(vectors.filter((v) => v.valid).length >= 50);
    assert.ok(vectors.filter((v) => !v.valid).length >= 30);
  });

  for (const v of vectors) {
    if (v.valid) {
      test(`${v.name} (line ${v.line})`, () => {
        const frame = decode(unhex(v.hex));
        assert.equal(formatFrame(frame), v.decoded, "hex → decoded form");
        assert.equal(hex(encode(parseDecoded(v.decoded))), v.hex, "decoded form → hex");
        assert.deepEqual(fromJson(toJson(frame)), frame, "through the JSON form and back");
      });
    } else {
      test(`invalid ${v.error}: ${v.comment} (line ${v.line})`, () => {
        assert.equal(refusal(unhex(v.hex)), v.error);
      });
    }
  }

  test("every message type has a vector", () => {
    const covered = new Set(vectors.flatMap((v) => (v.valid ? [parseDecoded(v.decoded).message.type] : [])));
    assert.deepEqual([...covered].sort(), Object.keys(TYPE_CODES).sort());
  });

  test("fatal errors are known from the header alone", () => {
    for (const v of vectors) {
      if (v.valid || !["too-long", "too-short", "bad-version"].includes(v.error)) continue;
      const header = unhex(v.hex).subarray(0, 5);
      assert.throws(() => check(header), (e: FrameError) => e.kind === v.error && e.fatal);
    }
  });

  test("every prefix of a valid frame is incomplete, the whole frame is whole", () => {
    for (const v of vectors) {
      if (!v.valid) continue;
      const bytes = unhex(v.hex);
      for (let cut = 0; cut < bytes.length; cut++) assert.equal(check(bytes.subarray(0, cut)), undefined, `${v.name} cut at ${cut}`);
      assert.equal(check(bytes), bytes.length);
    }
  });
});

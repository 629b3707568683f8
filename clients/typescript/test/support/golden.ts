/**
 * The golden file's text form (crates/proto/testdata/golden.txt): lines of vectors, and
 * the "decoded form" — `key=value` pairs in wire order — written from a message and read
 * back into one. The field kinds below are the file's documented value encodings; which
 * fields a message has, and in what order, comes from the message itself.
 */

import { hex, unhex } from "../../src/json.js";
import type { Frame, Message, MessageType } from "../../src/protocol.js";

export type Vector =
  | { valid: true; name: string; hex: string; decoded: string; line: number }
  | { valid: false; hex: string; error: string; comment: string; line: number };

export function parseGolden(text: string): Vector[] {
  const vectors: Vector[] = [];
  let comment = "";
  text.split("\n").forEach((raw, i) => {
    const line = raw.trim();
    if (line === "") return;
    if (line.startsWith("#")) {
      comment = line.slice(1).trim();
      return;
    }
    const fields = line.split(" | ");
    if (fields.length !== 3) throw new Error(`golden.txt line ${i + 1}: not three fields`);
    const [name, hexText, third] = fields as [string, string, string];
    if (name === "invalid") vectors.push({ valid: false, hex: hexText, error: third, comment, line: i + 1 });
    else vectors.push({ valid: true, name, hex: hexText, decoded: third, line: i + 1 });
  });
  return vectors;
}

/** u32 fields: numbers in the library; every other integer field is a u64 (bigint). */
const U32_FIELDS = new Set(["shares", "retry_after_ms"]);

const snake = (camel: string) => camel.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
const camel = (snakeName: string) => snakeName.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** The decoded form of a frame: `type=… request_id=…` then the message's fields in order. */
export function formatFrame(frame: Frame): string {
  const parts = [`type=${frame.message.type}`, `request_id=${frame.requestId}`];
  for (const [key, value] of Object.entries(frame.message)) {
    if (key === "type") continue;
    parts.push(`${snake(key)}=${formatValue(key, value)}`);
  }
  return parts.join(" ");
}

function formatValue(key: string, value: unknown): string {
  if (value instanceof Uint8Array) return hex(value);
  if (Array.isArray(value)) return value.map(String).join(",");
  if (key === "text") return percentEncode(value as string);
  return String(value);
}

/** The decoded form read back into a frame. */
export function parseDecoded(decoded: string): Frame {
  const pairs = decoded.split(" ").map((pair) => {
    const eq = pair.indexOf("=");
    return [pair.slice(0, eq), pair.slice(eq + 1)] as const;
  });
  const [typePair, idPair, ...fields] = pairs;
  if (typePair?.[0] !== "type" || idPair?.[0] !== "request_id") throw new Error(`bad decoded form: ${decoded}`);
  const message: Record<string, unknown> = { type: typePair[1] as MessageType };
  for (const [key, value] of fields) message[camel(key)] = parseValue(key, value);
  return { requestId: Number(idPair[1]), message: message as unknown as Message };
}

function parseValue(key: string, value: string): unknown {
  switch (key) {
    case "token":
      return unhex(value);
    case "recipients":
      return value === "" ? [] : value.split(",").map(BigInt);
    case "text":
      return percentDecode(value);
    case "result":
    case "reason":
    case "idempotency_key":
      return value;
    default:
      return U32_FIELDS.has(key) ? Number(value) : BigInt(value);
  }
}

/** `%`, space, `|`, controls (below 0x20, and 0x7f) as %XX; everything else as itself. */
export function percentEncode(text: string): string {
  let out = "";
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    out += c < 0x20 || c === 0x7f || ch === "%" || ch === " " || ch === "|" ? "%" + c.toString(16).toUpperCase().padStart(2, "0") : ch;
  }
  return out;
}

/** %XX to bytes, then UTF-8. */
export function percentDecode(text: string): string {
  const bytes: number[] = [];
  const utf8 = new TextEncoder();
  for (let i = 0; i < text.length; ) {
    if (text[i] === "%") {
      bytes.push(parseInt(text.slice(i + 1, i + 3), 16));
      i += 3;
    } else {
      const ch = String.fromCodePoint(text.codePointAt(i)!);
      bytes.push(...utf8.encode(ch));
      i += ch.length;
    }
  }
  return new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes));
}

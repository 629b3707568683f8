/**
 * The JSON form of the protocol (docs/protocol.md, "JSON form"), and a JSON reader that
 * keeps integers exact.
 *
 * `JSON.parse` turns every number into a double, so an id above 2^53 would come back
 * rounded without a word. {@link parseJson} reads integer literals as `bigint` instead
 * (other numbers stay `number`); the HTTP transport reads its answers with it too.
 * {@link toJson} writes a frame as the server does — `"type"` and `"id"` first, then the
 * fields in wire order — and {@link fromJson} reads one, refusing what the server's
 * `json.rs` would refuse (missing or ill-typed fields, out-of-range numbers, unknown
 * results, limits). No I/O here.
 */

import { truncatedUtf8 } from "./frame.js";
import {
  MAX_RECIPIENTS,
  MAX_TEXT_LEN,
  MAX_TOKEN_LEN,
  U64_MAX,
  isKickReason,
  isResultName,
  validIdempotencyKey,
  type Frame,
  type KickReason,
  type Message,
  type MessageType,
  type ResultName,
} from "./protocol.js";

export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | { [key: string]: JsonValue };

/** A text that is not a message, and the request id if it could be read. */
export class JsonFormError extends Error {
  constructor(
    message: string,
    readonly requestId?: number,
  ) {
    super(message);
    this.name = "JsonFormError";
  }
}

// ----- reading JSON ---------------------------------------------------------------------

/**
 * Parses JSON text like `JSON.parse`, except that integer literals (no fraction, no
 * exponent) become `bigint`s, exactly. Throws `SyntaxError` on bad JSON.
 */
export function parseJson(text: string): JsonValue {
  const p = new Parser(text);
  p.space();
  const value = p.value(0);
  p.space();
  if (p.at !== text.length) p.fail("unexpected text after the value");
  return value;
}

const MAX_DEPTH = 64;
const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;

class Parser {
  at = 0;

  constructor(private readonly text: string) {}

  fail(why: string): never {
    throw new SyntaxError(`bad JSON at offset ${this.at}: ${why}`);
  }

  space(): void {
    while (this.at < this.text.length) {
      const c = this.text.charCodeAt(this.at);
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return;
      this.at++;
    }
  }

  value(depth: number): JsonValue {
    if (depth > MAX_DEPTH) this.fail("nested too deep");
    const c = this.text[this.at];
    switch (c) {
      case "{":
        return this.object(depth);
      case "[":
        return this.array(depth);
      case '"':
        return this.string();
      case "t":
        return this.word("true", true);
      case "f":
        return this.word("false", false);
      case "n":
        return this.word("null", null);
      default:
        return this.number();
    }
  }

  private word<T>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.at)) this.fail(`expected ${word}`);
    this.at += word.length;
    return value;
  }

  private number(): number | bigint {
    NUMBER.lastIndex = this.at;
    const m = NUMBER.exec(this.text);
    if (!m) this.fail("expected a value");
    this.at += m[0].length;
    return m[1] === undefined && m[2] === undefined ? BigInt(m[0]) : Number(m[0]);
  }

  string(): string {
    STRING.lastIndex = this.at;
    const m = STRING.exec(this.text);
    if (!m) this.fail("bad string");
    this.at += m[0].length;
    // The regex checked the escapes; JSON.parse decodes them (surrogate pairs included).
    return m[0].includes("\\") ? (JSON.parse(m[0]) as string) : m[0].slice(1, -1);
  }

  private array(depth: number): JsonValue[] {
    this.at++;
    const out: JsonValue[] = [];
    this.space();
    if (this.text[this.at] === "]") {
      this.at++;
      return out;
    }
    for (;;) {
      this.space();
      out.push(this.value(depth + 1));
      this.space();
      const c = this.text[this.at++];
      if (c === "]") return out;
      if (c !== ",") this.fail("expected , or ]");
    }
  }

  private object(depth: number): { [key: string]: JsonValue } {
    this.at++;
    const out: { [key: string]: JsonValue } = {};
    this.space();
    if (this.text[this.at] === "}") {
      this.at++;
      return out;
    }
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') this.fail("expected a key");
      const key = this.string();
      this.space();
      if (this.text[this.at++] !== ":") this.fail("expected :");
      this.space();
      const value = this.value(depth + 1);
      // Own data property even for "__proto__".
      Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
      this.space();
      const c = this.text[this.at++];
      if (c === "}") return out;
      if (c !== ",") this.fail("expected , or }");
    }
  }
}

/** JSON text of a value that may hold bigints (written as integer literals). */
export function stringifyJson(value: JsonValue): string {
  if (typeof value === "bigint") return value.toString();
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(stringifyJson).join(",") + "]";
  const parts = Object.entries(value).map(([k, v]) => JSON.stringify(k) + ":" + stringifyJson(v));
  return "{" + parts.join(",") + "}";
}

// ----- the JSON form of frames ------------------------------------------------------------

/** The JSON `"type"` of each message type: the golden names with `_` for `-`. */
export function jsonTypeName(type: MessageType): string {
  return type.replace("-", "_");
}

const TYPES_BY_JSON_NAME = new Map<string, MessageType>(
  (
    [
      "login", "shake", "send", "open", "chat", "ping", "login-reply", "shake-reply", "send-reply",
      "open-reply", "chat-reply", "pong", "error", "packet-notice", "chat-message", "broadcast", "kick",
      "refresh",
    ] as const
  ).map((t) => [jsonTypeName(t), t]),
);

/** The text message of a frame, as the server writes it. */
export function toJson(frame: Frame): string {
  const m = frame.message;
  let out = `{"type":"${jsonTypeName(m.type)}","id":${frame.requestId}`;
  const put = (key: string, value: JsonValue) => {
    out += `,"${key}":${stringifyJson(value)}`;
  };
  const text = (s: string) => utf8Decoder.decode(truncatedUtf8(s));
  switch (m.type) {
    case "login":
      put("user_id", m.userId);
      // The JWT as it is (its bytes are ASCII); the server writes it so too.
      put("token", utf8Decoder.decode(m.token));
      break;
    case "shake":
      break;
    case "send":
      put("amount_cents", m.amountCents);
      put("shares", m.shares);
      put("recipients", m.recipients);
      if (m.idempotencyKey !== undefined) put("idempotency_key", m.idempotencyKey);
      break;
    case "open":
      put("packet_id", m.packetId);
      break;
    case "chat":
      put("to_user", m.toUser);
      put("text", text(m.text));
      break;
    case "ping":
      put("client_time_us", m.clientTimeUs);
      break;
    case "login-reply":
      put("result", m.result);
      put("user_id", m.userId);
      break;
    case "shake-reply":
      put("result", m.result);
      put("packet_id", m.packetId);
      put("amount_cents", m.amountCents);
      if (m.retryAfterMs) put("retry_after_ms", m.retryAfterMs);
      break;
    case "send-reply":
      put("result", m.result);
      put("packet_id", m.packetId);
      put("balance_cents", m.balanceCents);
      break;
    case "open-reply":
      put("result", m.result);
      put("packet_id", m.packetId);
      put("amount_cents", m.amountCents);
      break;
    case "chat-reply":
      put("result", m.result);
      break;
    case "pong":
      put("client_time_us", m.clientTimeUs);
      put("server_time_us", m.serverTimeUs);
      break;
    case "error":
      put("result", m.result);
      put("text", text(m.text));
      if (m.retryAfterMs) put("retry_after_ms", m.retryAfterMs);
      break;
    case "packet-notice":
      put("packet_id", m.packetId);
      put("from_user", m.fromUser);
      put("amount_cents", m.amountCents);
      put("shares", m.shares);
      put("expires_at_ms", m.expiresAtMs);
      break;
    case "chat-message":
      put("from_user", m.fromUser);
      put("text", text(m.text));
      break;
    case "broadcast":
      put("server_time_us", m.serverTimeUs);
      put("text", text(m.text));
      break;
    case "kick":
      put("reason", m.reason);
      put("text", text(m.text));
      if (m.retryAfterMs) put("retry_after_ms", m.retryAfterMs);
      break;
    case "refresh":
      put("expires_at_ms", m.expiresAtMs);
      break;
  }
  return out + "}";
}

/** Reads one text message; throws {@link JsonFormError} for one that is not a message. */
export function fromJson(text: string): Frame {
  let value: JsonValue;
  try {
    value = parseJson(text);
  } catch (e) {
    throw new JsonFormError(`not JSON: ${(e as Error).message}`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new JsonFormError("not a JSON object");
  }
  const f = new Fields(value);
  const requestId = f.u32("id");
  f.requestId = requestId;
  const typeName = f.string("type");
  const type = TYPES_BY_JSON_NAME.get(typeName);
  if (type === undefined) throw new JsonFormError(`unknown message type ${JSON.stringify(typeName)}`, requestId);
  return { requestId, message: readMessage(type, f) };
}

function readMessage(type: MessageType, f: Fields): Message {
  switch (type) {
    case "login":
      // `user_id` may be left out: 0, whoever the token names.
      return { type, userId: f.has("user_id") ? f.u64("user_id") : 0n, token: f.token("token") };
    case "shake":
      return { type };
    case "send": {
      const send: Message = { type, amountCents: f.u64("amount_cents"), shares: f.u32("shares"), recipients: f.ids("recipients") };
      if (f.has("idempotency_key")) {
        const key = f.string("idempotency_key");
        if (!validIdempotencyKey(key)) f.fail("field `idempotency_key` is not 1 to 64 characters of printable ASCII");
        send.idempotencyKey = key;
      }
      return send;
    }
    case "open":
      return { type, packetId: f.u64("packet_id") };
    case "chat":
      return { type, toUser: f.u64("to_user"), text: f.text("text") };
    case "ping":
      return { type, clientTimeUs: f.u64("client_time_us") };
    case "login-reply":
      return { type, result: f.result(), userId: f.u64("user_id") };
    case "shake-reply": {
      const reply: Message = { type, result: f.result(), packetId: f.u64("packet_id"), amountCents: f.u64("amount_cents") };
      const ms = f.retryAfterMs();
      if (ms !== undefined) reply.retryAfterMs = ms;
      return reply;
    }
    case "send-reply":
      return { type, result: f.result(), packetId: f.u64("packet_id"), balanceCents: f.u64("balance_cents") };
    case "open-reply":
      return { type, result: f.result(), packetId: f.u64("packet_id"), amountCents: f.u64("amount_cents") };
    case "chat-reply":
      return { type, result: f.result() };
    case "pong":
      return { type, clientTimeUs: f.u64("client_time_us"), serverTimeUs: f.u64("server_time_us") };
    case "error": {
      const reply: Message = { type, result: f.result(), text: f.text("text") };
      const ms = f.retryAfterMs();
      if (ms !== undefined) reply.retryAfterMs = ms;
      return reply;
    }
    case "packet-notice":
      return {
        type,
        packetId: f.u64("packet_id"),
        fromUser: f.u64("from_user"),
        amountCents: f.u64("amount_cents"),
        shares: f.u32("shares"),
        expiresAtMs: f.u64("expires_at_ms"),
      };
    case "chat-message":
      return { type, fromUser: f.u64("from_user"), text: f.text("text") };
    case "broadcast":
      return { type, serverTimeUs: f.u64("server_time_us"), text: f.text("text") };
    case "kick": {
      const kick: Message = { type, reason: f.kickReason(), text: f.text("text") };
      const ms = f.retryAfterMs();
      if (ms !== undefined) kick.retryAfterMs = ms;
      return kick;
    }
    case "refresh":
      return { type, expiresAtMs: f.u64("expires_at_ms") };
  }
}

/** Typed access to an object's fields; every failure names the field. */
export class Fields {
  requestId: number | undefined;

  constructor(private readonly object: { [key: string]: JsonValue }) {}

  fail(why: string): never {
    throw new JsonFormError(why, this.requestId);
  }

  has(key: string): boolean {
    return Object.prototype.hasOwnProperty.call(this.object, key) && this.object[key] !== null;
  }

  private get(key: string): JsonValue {
    if (!Object.prototype.hasOwnProperty.call(this.object, key)) this.fail(`field \`${key}\` missing`);
    return this.object[key]!;
  }

  u64(key: string): bigint {
    const v = this.get(key);
    if (typeof v !== "bigint") this.fail(`field \`${key}\` should be an integer`);
    if (v < 0n || v > U64_MAX) this.fail(`field \`${key}\` out of range`);
    return v;
  }

  u32(key: string): number {
    const v = this.u64(key);
    if (v > 0xffffffffn) this.fail(`field \`${key}\` out of range`);
    return Number(v);
  }

  /** A u64 or null (the HTTP API's `from_user` of a system packet). */
  u64OrNull(key: string): bigint | null {
    return this.has(key) ? this.u64(key) : null;
  }

  string(key: string): string {
    const v = this.get(key);
    if (typeof v !== "string") this.fail(`field \`${key}\` should be a string`);
    return v;
  }

  text(key: string): string {
    const s = this.string(key);
    if (utf8Encoder.encode(s).length > MAX_TEXT_LEN) this.fail(`field \`${key}\` over ${MAX_TEXT_LEN} bytes`);
    return s;
  }

  /** A login token: the JWT's compact form as it is, at most `MAX_TOKEN_LEN` bytes. */
  token(key: string): Uint8Array {
    const bytes = utf8Encoder.encode(this.string(key));
    if (bytes.length > MAX_TOKEN_LEN) this.fail(`token of ${bytes.length} bytes over limit ${MAX_TOKEN_LEN}`);
    return bytes;
  }

  /** The optional `retry_after_ms` (absent, null or 0: none). */
  retryAfterMs(): number | undefined {
    if (!this.has("retry_after_ms")) return undefined;
    const ms = this.u32("retry_after_ms");
    return ms === 0 ? undefined : ms;
  }

  ids(key: string): bigint[] {
    const v = this.get(key);
    if (!Array.isArray(v)) this.fail(`field \`${key}\` should be an array`);
    if (v.length > MAX_RECIPIENTS) this.fail(`${v.length} recipients over limit ${MAX_RECIPIENTS}`);
    return v.map((id) => {
      if (typeof id !== "bigint" || id < 0n || id > U64_MAX) this.fail(`field \`${key}\` should hold u64s`);
      return id;
    });
  }

  result(): ResultName {
    const name = this.string("result");
    if (!isResultName(name)) this.fail(`unknown result ${JSON.stringify(name)}`);
    return name;
  }

  kickReason(): KickReason {
    const name = this.string("reason");
    if (!isKickReason(name)) this.fail(`unknown kick reason ${JSON.stringify(name)}`);
    return name;
  }

  /** The raw value of a field, or undefined. */
  raw(key: string): JsonValue | undefined {
    return Object.prototype.hasOwnProperty.call(this.object, key) ? this.object[key] : undefined;
  }
}

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder();

export function hex(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}

/** Bytes of a hex string (either case); throws on anything else. */
export function unhex(s: string): Uint8Array {
  if (s.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(s)) throw new SyntaxError("not hex");
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}

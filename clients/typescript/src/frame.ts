/**
 * Binary frames ↔ messages, with no I/O: the TypeScript twin of `crates/proto/src/frame.rs`.
 *
 * ```text
 * [len: u32][version: u8][type: u8][request_id: u32][payload ...]   (big-endian)
 * ```
 *
 * A reader calls {@link check} on what it has buffered: it reads only the header and
 * never allocates, so a frame announcing more than `MAX_FRAME_LEN` is refused before
 * anything is kept for it. Once `check` says a whole frame is there, {@link decode}
 * turns exactly those bytes into a {@link Frame}; {@link encode} makes the bytes of one.
 *
 * Errors come in two grades, as in the Rust codec: a bad length or version is fatal (the
 * stream cannot be cut into frames any more); an unknown type or a malformed payload
 * still has a known end, so a reader can skip the frame and go on. Their `kind`s are the
 * names in `crates/proto/testdata/golden.txt`.
 */

import {
  HEADER_LEN,
  MAX_FRAME_LEN,
  MAX_RECIPIENTS,
  MAX_TEXT_LEN,
  MAX_TOKEN_LEN,
  TYPE_CODES,
  U64_MAX,
  VERSION,
  kickReasonCode,
  kickReasonFromCode,
  resultCode,
  resultFromCode,
  typeFromCode,
  validIdempotencyKey,
  type Frame,
  type Message,
  type ResultName,
} from "./protocol.js";

const PREFIX_LEN = 4;
const MIN_BODY_LEN = HEADER_LEN - PREFIX_LEN;

export type FatalFrameErrorKind = "too-long" | "too-short" | "bad-version";
export type PayloadErrorKind =
  | "short-payload"
  | "trailing-payload"
  | "bad-utf8"
  | "unknown-result"
  | "unknown-kick-reason"
  | "too-many-recipients"
  | "text-too-long"
  | "token-too-long"
  | "token-not-ascii"
  | "bad-idempotency-key"
  | "zero-retry-after";
export type FrameErrorKind =
  | FatalFrameErrorKind
  | PayloadErrorKind
  | "unknown-type"
  /** `decode` was handed fewer bytes than the frame announces (use `check` first). */
  | "incomplete"
  /** `decode` was handed more bytes than the frame announces. */
  | "trailing-bytes";

/** Bytes that are not a frame, graded like the Rust codec's `FrameError`. */
export class FrameError extends Error {
  readonly kind: FrameErrorKind;
  /** The frame's request id, when the frame was well delimited (recoverable errors). */
  readonly requestId: number | undefined;

  constructor(kind: FrameErrorKind, message: string, requestId?: number) {
    super(message);
    this.name = "FrameError";
    this.kind = kind;
    this.requestId = requestId;
  }

  /** Whether the byte stream can no longer be cut into frames. */
  get fatal(): boolean {
    return this.kind === "too-long" || this.kind === "too-short" || this.kind === "bad-version";
  }
}

/**
 * Whether `buf` starts with a whole frame: `undefined` (read more) or its length, length
 * prefix included. Throws a fatal {@link FrameError} as soon as the length (4 bytes) or
 * the version (5th byte) is known to be wrong. Never allocates.
 */
export function check(buf: Uint8Array): number | undefined {
  if (buf.length < PREFIX_LEN) return undefined;
  const len = readU32(buf, 0);
  if (len > MAX_FRAME_LEN) throw new FrameError("too-long", `frame length ${len} over limit ${MAX_FRAME_LEN}`);
  if (len < MIN_BODY_LEN) throw new FrameError("too-short", `frame length ${len} under the ${MIN_BODY_LEN}-byte minimum`);
  if (buf.length > PREFIX_LEN && buf[PREFIX_LEN] !== VERSION) {
    throw new FrameError("bad-version", `frame version ${buf[PREFIX_LEN]}, expected ${VERSION}`);
  }
  const total = PREFIX_LEN + len;
  return buf.length >= total ? total : undefined;
}

/** Decodes exactly one whole frame: `bytes` must be what {@link check} delimited. */
export function decode(bytes: Uint8Array): Frame {
  const total = check(bytes);
  if (total === undefined) {
    const need = bytes.length >= PREFIX_LEN ? PREFIX_LEN + readU32(bytes, 0) : PREFIX_LEN;
    throw new FrameError("incomplete", `incomplete frame: ${bytes.length} bytes given, ${need} needed`);
  }
  if (bytes.length > total) {
    throw new FrameError("trailing-bytes", `${bytes.length - total} bytes given after the end of the frame`);
  }
  const code = bytes[PREFIX_LEN + 1]!;
  const requestId = readU32(bytes, 6);
  const type = typeFromCode(code);
  if (type === undefined) {
    const hex = code.toString(16).padStart(2, "0");
    throw new FrameError("unknown-type", `unknown message type 0x${hex} in request ${requestId}`, requestId);
  }
  try {
    return { requestId, message: decodePayload(type, new Reader(bytes.subarray(HEADER_LEN))) };
  } catch (e) {
    if (e instanceof PayloadError) {
      throw new FrameError(e.kind, `bad payload for ${type} in request ${requestId}: ${e.message}`, requestId);
    }
    throw e;
  }
}

class PayloadError extends Error {
  constructor(
    readonly kind: PayloadErrorKind,
    message: string,
  ) {
    super(message);
  }
}

function decodePayload(type: Message["type"], r: Reader): Message {
  let message: Message;
  switch (type) {
    case "login": {
      const userId = r.u64("user_id");
      const len = r.u16("token_len");
      if (len > MAX_TOKEN_LEN) throw new PayloadError("token-too-long", `token of ${len} bytes over limit ${MAX_TOKEN_LEN}`);
      const token = r.bytes("token", len).slice();
      // A JWT's compact form: printable ASCII only.
      if (!token.every((b) => b > 0x20 && b < 0x7f)) throw new PayloadError("token-not-ascii", "token is not printable ASCII (a JWT's compact form)");
      message = { type, userId, token };
      break;
    }
    case "shake":
      message = { type };
      break;
    case "send": {
      const amountCents = r.u64("amount_cents");
      const shares = r.u32("shares");
      const count = r.u16("count");
      if (count > MAX_RECIPIENTS) {
        throw new PayloadError("too-many-recipients", `${count} recipients over limit ${MAX_RECIPIENTS}`);
      }
      // Check the ids are really there before making room for them.
      const ids = r.bytes("recipients", count * 8);
      const recipients: bigint[] = [];
      for (let at = 0; at < ids.length; at += 8) recipients.push(readU64(ids, at));
      const send: Message = { type, amountCents, shares, recipients };
      if (!r.done) {
        const len = r.u8("key_len");
        const key = latin1(r.bytes("key", len));
        if (!validIdempotencyKey(key)) {
          throw new PayloadError("bad-idempotency-key", "an idempotency key is 1 to 64 bytes of printable ASCII");
        }
        send.idempotencyKey = key;
      }
      message = send;
      break;
    }
    case "open":
      message = { type, packetId: r.u64("packet_id") };
      break;
    case "chat":
      message = { type, toUser: r.u64("to_user"), text: r.text() };
      break;
    case "ping":
      message = { type, clientTimeUs: r.u64("client_time_us") };
      break;
    case "login-reply":
      message = { type, result: r.result(), userId: r.u64("user_id") };
      break;
    case "shake-reply": {
      const reply: Message = { type, result: r.result(), packetId: r.u64("packet_id"), amountCents: r.u64("amount_cents") };
      const retryAfterMs = r.retryAfterMs();
      if (retryAfterMs !== undefined) reply.retryAfterMs = retryAfterMs;
      message = reply;
      break;
    }
    case "send-reply":
      message = { type, result: r.result(), packetId: r.u64("packet_id"), balanceCents: r.u64("balance_cents") };
      break;
    case "open-reply":
      message = { type, result: r.result(), packetId: r.u64("packet_id"), amountCents: r.u64("amount_cents") };
      break;
    case "chat-reply":
      message = { type, result: r.result() };
      break;
    case "pong":
      message = { type, clientTimeUs: r.u64("client_time_us"), serverTimeUs: r.u64("server_time_us") };
      break;
    case "error": {
      const reply: Message = { type, result: r.result(), text: r.text() };
      const retryAfterMs = r.retryAfterMs();
      if (retryAfterMs !== undefined) reply.retryAfterMs = retryAfterMs;
      message = reply;
      break;
    }
    case "packet-notice":
      message = {
        type,
        packetId: r.u64("packet_id"),
        fromUser: r.u64("from_user"),
        amountCents: r.u64("amount_cents"),
        shares: r.u32("shares"),
        expiresAtMs: r.u64("expires_at_ms"),
      };
      break;
    case "chat-message":
      message = { type, fromUser: r.u64("from_user"), text: r.text() };
      break;
    case "broadcast":
      message = { type, serverTimeUs: r.u64("server_time_us"), text: r.text() };
      break;
    case "kick": {
      const code = r.u8("reason");
      const reason = kickReasonFromCode(code);
      if (reason === undefined) throw new PayloadError("unknown-kick-reason", `unknown kick reason ${code}`);
      const kick: Message = { type, reason, text: r.text() };
      const retryAfterMs = r.retryAfterMs();
      if (retryAfterMs !== undefined) kick.retryAfterMs = retryAfterMs;
      message = kick;
      break;
    }
    case "refresh":
      message = { type, expiresAtMs: r.u64("expires_at_ms") };
      break;
  }
  if (!r.done) throw new PayloadError("trailing-payload", `${r.left} bytes after the payload`);
  return message;
}

/** A cursor over a payload; every read names its field, so errors say what was short. */
class Reader {
  private at = 0;
  private readonly view: DataView;

  constructor(private readonly buf: Uint8Array) {
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  get done(): boolean {
    return this.at === this.buf.length;
  }

  get left(): number {
    return this.buf.length - this.at;
  }

  bytes(field: string, n: number): Uint8Array {
    if (this.left < n) throw new PayloadError("short-payload", `${field}: ${n} bytes needed, ${this.left} left`);
    const out = this.buf.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  u8(field: string): number {
    this.bytes(field, 1);
    return this.view.getUint8(this.at - 1);
  }

  u16(field: string): number {
    this.bytes(field, 2);
    return this.view.getUint16(this.at - 2);
  }

  u32(field: string): number {
    this.bytes(field, 4);
    return this.view.getUint32(this.at - 4);
  }

  u64(field: string): bigint {
    this.bytes(field, 8);
    return this.view.getBigUint64(this.at - 8);
  }

  result(): ResultName {
    const code = this.u8("result");
    const name = resultFromCode(code);
    if (name === undefined) throw new PayloadError("unknown-result", `unknown result ${code}`);
    return name;
  }

  /** The optional trailing `retry_after_ms` (shake-reply, error, kick): present only when not 0, so that every message has one encoding. */
  retryAfterMs(): number | undefined {
    if (this.done) return undefined;
    const ms = this.u32("retry_after_ms");
    if (ms === 0) throw new PayloadError("zero-retry-after", "retry_after_ms written as 0");
    return ms;
  }

  text(): string {
    const len = this.u16("text_len");
    if (len > MAX_TEXT_LEN) throw new PayloadError("text-too-long", `text of ${len} bytes over limit ${MAX_TEXT_LEN}`);
    const bytes = this.bytes("text", len);
    try {
      return utf8Decoder.decode(bytes);
    } catch {
      throw new PayloadError("bad-utf8", "text is not UTF-8");
    }
  }
}

const utf8Decoder = new TextDecoder("utf-8", { fatal: true });
const utf8Encoder = new TextEncoder();

function latin1(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return s;
}

function readU32(buf: Uint8Array, at: number): number {
  return ((buf[at]! << 24) | (buf[at + 1]! << 16) | (buf[at + 2]! << 8) | buf[at + 3]!) >>> 0;
}

function readU64(buf: Uint8Array, at: number): bigint {
  return (BigInt(readU32(buf, at)) << 32n) | BigInt(readU32(buf, at + 4));
}

// ----- encoding -----------------------------------------------------------------------

/**
 * The bytes of one frame. Like the Rust encoder it clamps what would not fit a length
 * field — a text over `MAX_TEXT_LEN` bytes is cut at the last UTF-8 character boundary
 * at or before it, a token or a recipient list over 65,535 to 65,535 —
 * and writes tokens over `MAX_TOKEN_LEN` and lists over `MAX_RECIPIENTS` as given (they
 * will not decode). Throws a `RangeError` for a number outside its field's type.
 */
export function encode(frame: Frame): Uint8Array {
  const w = new Writer();
  w.u32(0); // the length, filled in below
  w.u8(VERSION);
  w.u8(TYPE_CODES[frame.message.type]);
  w.u32(frame.requestId, "request_id");
  encodePayload(frame.message, w);
  const bytes = w.finish();
  new DataView(bytes.buffer, bytes.byteOffset).setUint32(0, bytes.length - PREFIX_LEN);
  return bytes;
}

function encodePayload(m: Message, w: Writer): void {
  switch (m.type) {
    case "login": {
      const token = m.token.subarray(0, 0xffff);
      w.u64(m.userId, "user_id");
      w.u16(token.length);
      w.bytes(token);
      return;
    }
    case "shake":
      return;
    case "send": {
      const recipients = m.recipients.slice(0, 0xffff);
      w.u64(m.amountCents, "amount_cents");
      w.u32(m.shares, "shares");
      w.u16(recipients.length);
      for (const id of recipients) w.u64(id, "recipients");
      if (m.idempotencyKey !== undefined) {
        if (!validIdempotencyKey(m.idempotencyKey)) {
          throw new RangeError("an idempotency key is 1 to 64 bytes of printable ASCII");
        }
        w.u8(m.idempotencyKey.length);
        for (let i = 0; i < m.idempotencyKey.length; i++) w.u8(m.idempotencyKey.charCodeAt(i));
      }
      return;
    }
    case "open":
      w.u64(m.packetId, "packet_id");
      return;
    case "chat":
      w.u64(m.toUser, "to_user");
      w.text(m.text);
      return;
    case "ping":
      w.u64(m.clientTimeUs, "client_time_us");
      return;
    case "login-reply":
      w.u8(resultCode(m.result));
      w.u64(m.userId, "user_id");
      return;
    case "shake-reply":
      w.u8(resultCode(m.result));
      w.u64(m.packetId, "packet_id");
      w.u64(m.amountCents, "amount_cents");
      if (m.retryAfterMs) w.u32(m.retryAfterMs, "retry_after_ms");
      return;
    case "send-reply":
      w.u8(resultCode(m.result));
      w.u64(m.packetId, "packet_id");
      w.u64(m.balanceCents, "balance_cents");
      return;
    case "open-reply":
      w.u8(resultCode(m.result));
      w.u64(m.packetId, "packet_id");
      w.u64(m.amountCents, "amount_cents");
      return;
    case "chat-reply":
      w.u8(resultCode(m.result));
      return;
    case "pong":
      w.u64(m.clientTimeUs, "client_time_us");
      w.u64(m.serverTimeUs, "server_time_us");
      return;
    case "error":
      w.u8(resultCode(m.result));
      w.text(m.text);
      if (m.retryAfterMs) w.u32(m.retryAfterMs, "retry_after_ms");
      return;
    case "packet-notice":
      w.u64(m.packetId, "packet_id");
      w.u64(m.fromUser, "from_user");
      w.u64(m.amountCents, "amount_cents");
      w.u32(m.shares, "shares");
      w.u64(m.expiresAtMs, "expires_at_ms");
      return;
    case "chat-message":
      w.u64(m.fromUser, "from_user");
      w.text(m.text);
      return;
    case "broadcast":
      w.u64(m.serverTimeUs, "server_time_us");
      w.text(m.text);
      return;
    case "kick":
      w.u8(kickReasonCode(m.reason));
      w.text(m.text);
      if (m.retryAfterMs) w.u32(m.retryAfterMs, "retry_after_ms");
      return;
    case "refresh":
      w.u64(m.expiresAtMs, "expires_at_ms");
      return;
  }
}

/** The UTF-8 of `text`, cut at the last character boundary at or before `MAX_TEXT_LEN` bytes. */
export function truncatedUtf8(text: string): Uint8Array {
  const bytes = utf8Encoder.encode(text);
  if (bytes.length <= MAX_TEXT_LEN) return bytes;
  let end = MAX_TEXT_LEN;
  // Back up over continuation bytes (10xxxxxx) to the start of the cut character.
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end);
}

/** A growable output buffer. */
class Writer {
  private buf = new Uint8Array(64);
  private view = new DataView(this.buf.buffer);
  private len = 0;

  private room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const bigger = new Uint8Array(Math.max(this.buf.length * 2, this.len + n));
    bigger.set(this.buf.subarray(0, this.len));
    this.buf = bigger;
    this.view = new DataView(bigger.buffer);
  }

  u8(v: number): void {
    this.room(1);
    this.view.setUint8(this.len, v);
    this.len += 1;
  }

  u16(v: number): void {
    this.room(2);
    this.view.setUint16(this.len, v);
    this.len += 2;
  }

  u32(v: number, field?: string): void {
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`${field}: ${v} is not a u32`);
    this.room(4);
    this.view.setUint32(this.len, v);
    this.len += 4;
  }

  u64(v: bigint, field: string): void {
    if (typeof v !== "bigint" || v < 0n || v > U64_MAX) throw new RangeError(`${field}: ${String(v)} is not a u64`);
    this.room(8);
    this.view.setBigUint64(this.len, v);
    this.len += 8;
  }

  bytes(b: Uint8Array): void {
    this.room(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }

  text(text: string): void {
    const bytes = truncatedUtf8(text);
    this.u16(bytes.length);
    this.bytes(bytes);
  }

  finish(): Uint8Array {
    return this.buf.slice(0, this.len);
  }
}

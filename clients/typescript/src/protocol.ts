/**
 * The messages of the hongbao wire protocol (docs/protocol.md), both directions, as
 * plain values, with the protocol's limits and code tables.
 *
 * `frame.ts` turns these into binary frames and back, `json.ts` into the JSON form; no
 * I/O happens here or there. Field names are the documented ones in camelCase
 * (`amount_cents` → `amountCents`).
 *
 * Numbers: every u64 field (ids, cents, times) is a `bigint`, so a value above 2^53
 * (the golden file has `18446744073709551615`) is carried exactly; u8/u16/u32 fields
 * (request ids, shares, `retryAfterMs`) are `number`s, which hold them exactly.
 */

/**
 * Version byte of every frame a client writes, and the only one a client reads: servers
 * write nothing else. (A server still reads version 1 for the old HMAC login of the C
 * floor client; this library speaks version 2 only.)
 */
export const VERSION = 2;
/** Largest frame body (everything after the 4-byte length prefix), in bytes. */
export const MAX_FRAME_LEN = 16 * 1024;
/** Length prefix + version + type + request id. */
export const HEADER_LEN = 10;
/** Most recipients one send may name. */
export const MAX_RECIPIENTS = 1000;
/** Longest chat, error, broadcast or kick text, in bytes of UTF-8. */
export const MAX_TEXT_LEN = 4096;
/** Longest login token (a JWT's compact form), in bytes. */
export const MAX_TOKEN_LEN = 2048;
/** Longest idempotency key of a send, in bytes of printable ASCII. */
export const MAX_IDEMPOTENCY_KEY_LEN = 64;
/** Largest JSON text message the gateway reads, in bytes. */
export const MAX_JSON_LEN = 32 * 1024;
/** Largest u64. */
export const U64_MAX = (1n << 64n) - 1n;

/** Result codes, by wire value: one namespace for every reply. */
export const RESULT_NAMES = [
  "ok",
  "won",
  "nothing",
  "overloaded",
  "opened",
  "already-opened",
  "empty",
  "not-a-recipient",
  "expired",
  "insufficient-funds",
  "bad-request",
  "delivered",
  "offline",
  "bad-token",
  "not-logged-in",
  "unknown-type",
  "no-such-packet",
  "unavailable",
  "rate-limited",
] as const;
export type ResultName = (typeof RESULT_NAMES)[number];

/** Kick reasons, by wire value (the table starts at 1). */
export const KICK_REASONS = [
  "replaced",
  "bad-token",
  "bad-frame",
  "idle",
  "slow-reader",
  "shutdown",
  "expired",
  "revoked",
] as const;
export type KickReason = (typeof KICK_REASONS)[number];

export function resultFromCode(code: number): ResultName | undefined {
  return RESULT_NAMES[code];
}

export function resultCode(name: ResultName): number {
  return RESULT_NAMES.indexOf(name);
}

export function isResultName(name: string): name is ResultName {
  return (RESULT_NAMES as readonly string[]).includes(name);
}

export function kickReasonFromCode(code: number): KickReason | undefined {
  return code >= 1 ? KICK_REASONS[code - 1] : undefined;
}

export function kickReasonCode(reason: KickReason): number {
  return KICK_REASONS.indexOf(reason) + 1;
}

export function isKickReason(name: string): name is KickReason {
  return (KICK_REASONS as readonly string[]).includes(name);
}

/** Whether `key` may be an idempotency key: 1 to 64 bytes of printable ASCII, no spaces. */
export function validIdempotencyKey(key: string): boolean {
  return /^[\x21-\x7e]{1,64}$/.test(key);
}

// ----- messages ---------------------------------------------------------------------
// Properties are declared, and built by the decoders, in wire order: the conformance test
// relies on it to write the golden file's decoded form.

export type Login = {
  type: "login";
  /** 0: whoever the token names. */
  userId: bigint;
  /** A JWT's compact form, as its ASCII bytes. */
  token: Uint8Array;
};
export type Shake = { type: "shake" };
export type Send = {
  type: "send";
  amountCents: bigint;
  shares: number;
  recipients: bigint[];
  /** Absent: the frame carries no key (a send as before keys existed). */
  idempotencyKey?: string;
};
export type Open = { type: "open"; packetId: bigint };
export type Chat = { type: "chat"; toUser: bigint; text: string };
export type Ping = { type: "ping"; clientTimeUs: bigint };

export type LoginReply = { type: "login-reply"; result: ResultName; userId: bigint };
export type ShakeReply = {
  type: "shake-reply";
  result: ResultName;
  packetId: bigint;
  amountCents: bigint;
  /** Only on `overloaded` or `rate-limited`, and never 0: absent when the server names no wait. */
  retryAfterMs?: number;
};
export type SendReply = { type: "send-reply"; result: ResultName; packetId: bigint; balanceCents: bigint };
export type OpenReply = { type: "open-reply"; result: ResultName; packetId: bigint; amountCents: bigint };
export type ChatReply = { type: "chat-reply"; result: ResultName };
export type Pong = { type: "pong"; clientTimeUs: bigint; serverTimeUs: bigint };
export type ErrorReply = {
  type: "error";
  result: ResultName;
  text: string;
  /** Only on `rate-limited`, and never 0: when the request would be allowed. */
  retryAfterMs?: number;
};

export type PacketNotice = {
  type: "packet-notice";
  packetId: bigint;
  /** 0: a system campaign. */
  fromUser: bigint;
  amountCents: bigint;
  shares: number;
  expiresAtMs: bigint;
};
export type ChatMessage = { type: "chat-message"; fromUser: bigint; text: string };
export type Broadcast = { type: "broadcast"; serverTimeUs: bigint; text: string };
export type Kick = {
  type: "kick";
  reason: KickReason;
  text: string;
  /**
   * Come back after about this long (a server draining its connections spreads them
   * over a window); never 0: absent when the server names no wait.
   */
  retryAfterMs?: number;
};
/** The session's token ends at `expiresAtMs`: log in again on the same connection with a fresh one. */
export type Refresh = { type: "refresh"; expiresAtMs: bigint };

export type ClientMessage = Login | Shake | Send | Open | Chat | Ping;
export type Reply = LoginReply | ShakeReply | SendReply | OpenReply | ChatReply | Pong | ErrorReply;
export type Push = PacketNotice | ChatMessage | Broadcast | Kick | Refresh;
export type Message = ClientMessage | Reply | Push;
export type MessageType = Message["type"];

/** One frame: the request id (0 on pushes) and the message it carries. */
export interface Frame {
  requestId: number;
  message: Message;
}

/** Type codes, by message type. */
export const TYPE_CODES: Readonly<Record<MessageType, number>> = {
  login: 0x01,
  shake: 0x02,
  send: 0x03,
  open: 0x04,
  chat: 0x05,
  ping: 0x06,
  "login-reply": 0x81,
  "shake-reply": 0x82,
  "send-reply": 0x83,
  "open-reply": 0x84,
  "chat-reply": 0x85,
  pong: 0x86,
  error: 0x87,
  "packet-notice": 0x90,
  "chat-message": 0x91,
  broadcast: 0x92,
  kick: 0x93,
  refresh: 0x94,
};

const TYPES_BY_CODE = new Map<number, MessageType>(
  Object.entries(TYPE_CODES).map(([name, code]) => [code, name as MessageType]),
);

export function typeFromCode(code: number): MessageType | undefined {
  return TYPES_BY_CODE.get(code);
}

export function isReply(message: Message): message is Reply {
  const code = TYPE_CODES[message.type];
  return code >= 0x81 && code <= 0x87;
}

export function isPush(message: Message): message is Push {
  return TYPE_CODES[message.type] >= 0x90;
}

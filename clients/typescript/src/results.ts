/**
 * What each request can come back with, as discriminated unions on `result` — the same
 * whichever transport carried it — and the mapping from the WebSocket replies and the
 * HTTP answers into them.
 *
 * Every union has `unavailable` (the server could not reach its core; nothing was done,
 * the request may be retried), `rate-limited` (over one of the user's limits; nothing was
 * done; `retryAfterMs` says when it would be allowed) and `refused` (the server answered
 * with a result that does not belong to this request — its `error` reply, or an HTTP
 * error answer — `code` names it). `bad-request` carries the server's text when it gave
 * one.
 */

import { Fields, type JsonValue } from "./json.js";
import { isResultName, type Reply, type ResultName } from "./protocol.js";

export type Unavailable = { result: "unavailable" };
/** Over one of the user's limits (docs/security.md); nothing was done. */
export type RateLimited = {
  result: "rate-limited";
  /** When the request would be allowed (null: the server named no wait). */
  retryAfterMs: number | null;
  text: string;
};
export type Refused = { result: "refused"; code: ResultName; text: string };
export type BadRequest = { result: "bad-request"; text: string };

export type ShakeResult =
  | { result: "won"; packetId: bigint; amountCents: bigint }
  | { result: "nothing" }
  | {
      result: "overloaded";
      /** The wait the server asked for (null: it named none), or what is left of it. */
      retryAfterMs: number | null;
      /** True when the client answered itself: the server's wait had not passed, nothing was sent. */
      heldBack: boolean;
    }
  | (RateLimited & {
      /** True when the client answered itself: the server's wait had not passed, nothing was sent. */
      heldBack: boolean;
    })
  | Unavailable
  | Refused;

export type SendResult =
  | { result: "ok"; packetId: bigint; balanceCents: bigint; idempotencyKey: string }
  | { result: "insufficient-funds"; balanceCents: bigint; idempotencyKey: string }
  | BadRequest
  | RateLimited
  | Unavailable
  | Refused;

export type OpenResult =
  | { result: "opened" | "already-opened"; packetId: bigint; amountCents: bigint }
  | { result: "empty" | "not-a-recipient" | "expired" | "no-such-packet"; packetId: bigint }
  | BadRequest
  | RateLimited
  | Unavailable
  | Refused;

export type ChatResult = { result: "delivered" | "offline" } | BadRequest | RateLimited | Unavailable | Refused;

export type PingResult =
  | {
      result: "ok";
      /** Round trip measured by this client, in milliseconds. */
      rttMs: number;
      serverTimeUs: bigint;
    }
  | RateLimited
  | Unavailable
  | Refused;

/** One of my ledger events, as the server stores it (`kind` plus its fields). */
export type LedgerEvent = { [key: string]: JsonValue };

export type MeResult =
  | { result: "ok"; userId: bigint; balanceCents: bigint; recentEvents: LedgerEvent[] }
  | RateLimited
  | Unavailable
  | Refused;

/** A packet naming me: a push, or a line of `GET /v1/notices`. */
export interface PacketNotice {
  packetId: bigint;
  /** Null for a system campaign's packet (user 0 on the wire). */
  fromUser: bigint | null;
  amountCents: bigint;
  shares: number;
  expiresAtMs: bigint;
}

// ----- from WebSocket replies -----------------------------------------------------------

/** Replies that carry a result (all but `pong`). */
type ResultReply = Exclude<Reply, { type: "pong" }>;

function refusedOrUnavailable(reply: ResultReply): Unavailable | RateLimited | Refused | BadRequest {
  if (reply.result === "unavailable") return { result: "unavailable" };
  const text = reply.type === "error" ? reply.text : "";
  if (reply.result === "rate-limited") {
    const retryAfterMs = reply.type === "error" || reply.type === "shake-reply" ? reply.retryAfterMs : undefined;
    return { result: "rate-limited", retryAfterMs: retryAfterMs ?? null, text };
  }
  if (reply.result === "bad-request") return { result: "bad-request", text };
  return { result: "refused", code: reply.result, text };
}

/** Anything else is `refused`, with a text saying what came. */
function unexpected(reply: Reply, wanted: string): Refused {
  return { result: "refused", code: reply.type === "error" ? reply.result : "bad-request", text: `a ${reply.type} answered a ${wanted}` };
}

export function shakeFromReply(reply: Reply): ShakeResult {
  if (reply.type === "shake-reply") {
    switch (reply.result) {
      case "won":
        return { result: "won", packetId: reply.packetId, amountCents: reply.amountCents };
      case "nothing":
        return { result: "nothing" };
      case "overloaded":
        return { result: "overloaded", retryAfterMs: reply.retryAfterMs ?? null, heldBack: false };
    }
  }
  if (reply.type !== "shake-reply" && reply.type !== "error") return unexpected(reply, "shake");
  return shakeOther(refusedOrUnavailable(reply));
}

/** A shake's answer that is not a shake's outcome: a bad-request is a refusal, a rate limit not held back. */
function shakeOther(other: Unavailable | RateLimited | Refused | BadRequest): ShakeResult {
  if (other.result === "bad-request") return { result: "refused", code: "bad-request", text: other.text };
  if (other.result === "rate-limited") return { ...other, heldBack: false };
  return other;
}

export function sendFromReply(reply: Reply, idempotencyKey: string): SendResult {
  if (reply.type === "send-reply") {
    if (reply.result === "ok") return { result: "ok", packetId: reply.packetId, balanceCents: reply.balanceCents, idempotencyKey };
    if (reply.result === "insufficient-funds") return { result: "insufficient-funds", balanceCents: reply.balanceCents, idempotencyKey };
  }
  if (reply.type !== "send-reply" && reply.type !== "error") return unexpected(reply, "send");
  return refusedOrUnavailable(reply);
}

export function openFromReply(reply: Reply, packetId: bigint): OpenResult {
  if (reply.type === "open-reply") {
    switch (reply.result) {
      case "opened":
      case "already-opened":
        return { result: reply.result, packetId: reply.packetId, amountCents: reply.amountCents };
      case "empty":
      case "not-a-recipient":
      case "expired":
      case "no-such-packet":
        return { result: reply.result, packetId };
    }
  }
  if (reply.type !== "open-reply" && reply.type !== "error") return unexpected(reply, "open");
  return refusedOrUnavailable(reply);
}

export function chatFromReply(reply: Reply): ChatResult {
  if (reply.type === "chat-reply" && (reply.result === "delivered" || reply.result === "offline")) {
    return { result: reply.result };
  }
  if (reply.type !== "chat-reply" && reply.type !== "error") return unexpected(reply, "chat");
  return refusedOrUnavailable(reply);
}

export function pingFromReply(reply: Reply, rttMs: number): PingResult {
  if (reply.type === "pong") return { result: "ok", rttMs, serverTimeUs: reply.serverTimeUs };
  if (reply.type !== "error") return unexpected(reply, "ping");
  const other = refusedOrUnavailable(reply);
  return other.result === "bad-request" ? { result: "refused", code: "bad-request", text: other.text } : other;
}

// ----- from HTTP answers --------------------------------------------------------------------

/** An HTTP answer: its status, its JSON body's fields, and its `Retry-After` in ms. */
export interface HttpAnswer {
  status: number;
  body: Fields;
  retryAfterMs: number | undefined;
}

function httpOther(answer: HttpAnswer, result: string): Unavailable | RateLimited | Refused | BadRequest {
  const text = answer.body.has("error") ? answer.body.string("error") : "";
  if (result === "unavailable") return { result: "unavailable" };
  if (result === "rate-limited") {
    // The body's milliseconds are finer than the header's whole seconds.
    const ms = answer.body.has("retry_after_ms") ? answer.body.u32("retry_after_ms") : answer.retryAfterMs;
    return { result, retryAfterMs: ms ?? null, text };
  }
  if (result === "bad-request") return { result: "bad-request", text };
  const code = isResultName(result) ? result : "bad-request";
  return { result: "refused", code, text: text || `HTTP ${answer.status}` };
}

function resultOf(answer: HttpAnswer): string {
  return answer.body.has("result") ? answer.body.string("result") : "bad-request";
}

export function shakeFromHttp(answer: HttpAnswer): ShakeResult {
  const result = resultOf(answer);
  switch (result) {
    case "won":
      return { result, packetId: answer.body.u64("packet_id"), amountCents: answer.body.u64("amount_cents") };
    case "nothing":
      return { result };
    case "overloaded": {
      // The body's milliseconds are finer than the header's whole seconds.
      const ms = answer.body.has("retry_after_ms") ? answer.body.u32("retry_after_ms") : answer.retryAfterMs;
      return { result, retryAfterMs: ms ?? null, heldBack: false };
    }
  }
  return shakeOther(httpOther(answer, result));
}

export function sendFromHttp(answer: HttpAnswer, idempotencyKey: string): SendResult {
  const result = resultOf(answer);
  if (result === "ok") {
    return { result, packetId: answer.body.u64("packet_id"), balanceCents: answer.body.u64("balance_cents"), idempotencyKey };
  }
  if (result === "insufficient-funds") return { result, balanceCents: answer.body.u64("balance_cents"), idempotencyKey };
  return httpOther(answer, result);
}

export function openFromHttp(answer: HttpAnswer, packetId: bigint): OpenResult {
  const result = resultOf(answer);
  switch (result) {
    case "opened":
    case "already-opened":
      return { result, packetId: answer.body.u64("packet_id"), amountCents: answer.body.u64("amount_cents") };
    case "empty":
    case "not-a-recipient":
    case "expired":
    case "no-such-packet":
      return { result, packetId };
  }
  return httpOther(answer, result);
}

export function chatFromHttp(answer: HttpAnswer): ChatResult {
  const result = resultOf(answer);
  if (result === "delivered" || result === "offline") return { result };
  return httpOther(answer, result);
}

export function meFromHttp(answer: HttpAnswer): MeResult {
  const result = resultOf(answer);
  if (result === "ok") {
    const events = answer.body.raw("recent_events");
    return {
      result,
      userId: answer.body.u64("user"),
      balanceCents: answer.body.u64("balance_cents"),
      recentEvents: Array.isArray(events) ? (events as LedgerEvent[]) : [],
    };
  }
  const other = httpOther(answer, result);
  return other.result === "bad-request" ? { result: "refused", code: "bad-request", text: other.text } : other;
}

/** The notices of `GET /v1/notices`; throws a JsonFormError on a malformed line. */
export function noticesFromHttp(answer: HttpAnswer): PacketNotice[] {
  const list = answer.body.raw("notices");
  if (!Array.isArray(list)) return [];
  return list.map((item) => {
    if (item === null || typeof item !== "object" || Array.isArray(item)) {
      throw new TypeError("a notice is not an object");
    }
    const f = new Fields(item);
    return {
      packetId: f.u64("packet_id"),
      fromUser: f.u64OrNull("from_user"),
      amountCents: f.u64("amount_cents"),
      shares: f.u32("shares"),
      expiresAtMs: f.u64("expires_at_ms"),
    };
  });
}

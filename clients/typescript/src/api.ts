/**
 * Everything both entries export besides `connect`: the client's types, the codecs,
 * tokens. `index.ts` (browsers) and `node.ts` (Node) add a `connect` bound to their
 * WebSocket.
 */

export { Client, type ConnectOptions, type SendRequest } from "./client.js";
export type { Connect } from "./connect.js";
export type { HttpFetch, HttpInit, HttpAnswerLike } from "./client.js";
export { HongbaoError, type HongbaoErrorKind, type ErrorSource } from "./errors.js";
export type { ClientEvents, ClientState, Listener } from "./events.js";
export {
  Backoff,
  ShakeGate,
  jittered,
  DEFAULT_OVERLOADED_WAIT_MS,
  DEFAULT_RECONNECT_BASE_MS,
  DEFAULT_RECONNECT_CAP_MS,
} from "./backoff.js";
export { platformClock, type Clock, type TimerHandle } from "./clock.js";
export { FrameError, check, decode, encode, type FrameErrorKind } from "./frame.js";
export { JsonFormError, fromJson, toJson, parseJson, stringifyJson, hex, unhex, type JsonValue } from "./json.js";
export type { U64Input } from "./numbers.js";
export * as protocol from "./protocol.js";
export type { Frame, Message, ResultName, KickReason } from "./protocol.js";
export type { RefreshToken } from "./credentials.js";
export type {
  ShakeResult,
  SendResult,
  OpenResult,
  ChatResult,
  PingResult,
  MeResult,
  PacketNotice,
  LedgerEvent,
  Refused,
  RateLimited,
  Unavailable,
  BadRequest,
} from "./results.js";
export type { SocketFactory, WireSocket, SocketEvents, CloseInfo } from "./socket.js";
export { DEFAULT_KID, DEV_SECRET, devToken, tokenClaims, type DevTokenOptions, type TokenClaims } from "./token.js";
export { newIdempotencyKey } from "./platform.js";

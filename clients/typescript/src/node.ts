/**
 * The Node entry (Node ≥ 18): the platform's `WebSocket` where Node has one (≥ 22),
 * else the small RFC 6455 client in `node-ws.ts`; `node:crypto`'s WebCrypto where there
 * is no global `crypto` (Node 18).
 */

import { webcrypto } from "node:crypto";

import { connectUsing } from "./connect.js";
import { nodeSocket } from "./node-ws.js";
import { useCrypto } from "./platform.js";
import { platformSocket } from "./socket.js";

export * from "./api.js";
export { nodeSocket } from "./node-ws.js";

useCrypto(webcrypto as unknown as Crypto);

/** Connects and logs in; see `ConnectOptions`. */
export const connect = connectUsing(() =>
  typeof (globalThis as { WebSocket?: unknown }).WebSocket === "function" ? platformSocket : nodeSocket,
);

/**
 * The Node entry (Node ≥ 18). WebSockets: the library's own RFC 6455 client
 * (`node-ws.ts`) for every `wss://` URL — over `node:tls`, it trusts the `ca` option and
 * tells a TLS failure from a lost connection — and for `ws://` where Node has no global
 * `WebSocket` (< 22); the platform's `WebSocket` for `ws://` elsewhere. HTTP: the global
 * `fetch`, or with `ca` one over `node:https` that trusts it (`node-http.ts`).
 * `node:crypto`'s WebCrypto where there is no global `crypto` (Node 18).
 */

import { webcrypto } from "node:crypto";

import type { HttpFetch } from "./client.js";
import { connectUsing } from "./connect.js";
import { nodeHttpsFetch } from "./node-http.js";
import { nodeSocket, nodeSocketWith } from "./node-ws.js";
import { useCrypto } from "./platform.js";
import { platformSocket } from "./socket.js";

export * from "./api.js";
export { nodeSocket, nodeSocketWith, type NodeSocketOptions, type TrustedCa } from "./node-ws.js";

useCrypto(webcrypto as unknown as Crypto);

const hasWebSocket = () => typeof (globalThis as { WebSocket?: unknown }).WebSocket === "function";

/** Connects and logs in; see `ConnectOptions`. */
export const connect = connectUsing({
  sockets: (url, options) => {
    if (options.ca !== undefined) return nodeSocketWith({ ca: options.ca });
    return url.protocol === "wss:" || !hasWebSocket() ? nodeSocket : platformSocket;
  },
  fetch: (options) => {
    if (options.ca === undefined) return undefined;
    const plain = (globalThis as { fetch?: HttpFetch }).fetch;
    if (plain === undefined) throw new Error("this platform has no fetch");
    return nodeHttpsFetch(options.ca, plain.bind(globalThis));
  },
});

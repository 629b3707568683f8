/**
 * The seam between the client and a WebSocket implementation.
 *
 * The client needs little of a WebSocket: open, send a message, hear messages and one
 * close. {@link platformSocket} adapts the platform's `WebSocket` (browsers, Node ≥ 22);
 * `node-ws.ts` is a small RFC 6455 client over `node:net` and `node:tls` for Node (versions
 * without one, and every `wss://` URL: it takes a CA to trust), and only the Node entry
 * imports it, so the browser build stays platform-only.
 */

/** How a connection ended. */
export interface CloseInfo {
  /** The close code (1006: closed without a close frame, e.g. the peer died). */
  code: number;
  reason: string;
  /**
   * The HTTP status of a refused upgrade, and its `Retry-After` in milliseconds; only a
   * client that can see the handshake answer (the Node one) fills them in.
   */
  status?: number;
  retryAfterMs?: number;
  /**
   * Set when TLS failed in a way no retry mends (an untrusted certificate, a refused
   * handshake, a plain URL at a TLS port), saying why; the client then stops. Only a
   * client that can see why (the Node one) fills it in: a browser's WebSocket reports any
   * failure as a bare 1006.
   */
  tls?: string;
}

export interface SocketEvents {
  open(): void;
  message(data: string | Uint8Array): void;
  /** Called exactly once, whether the socket opened or not. */
  close(info: CloseInfo): void;
}

export interface WireSocket {
  send(data: string | Uint8Array): void;
  /** A clean close: a close frame, then the end of the connection. */
  close(code?: number, reason?: string): void;
  /** Drops the connection at once, as a network failure would (no close frame). */
  abort(): void;
}

export type SocketFactory = (url: string, events: SocketEvents) => WireSocket;

/** A socket over the platform's `WebSocket` class (throws if there is none). */
export const platformSocket: SocketFactory = (url, events) => {
  const WebSocketClass = (globalThis as { WebSocket?: typeof WebSocket }).WebSocket;
  if (WebSocketClass === undefined) throw new Error("this platform has no WebSocket class");
  const ws = new WebSocketClass(url);
  ws.binaryType = "arraybuffer";
  let closed = false;
  const finish = (info: CloseInfo) => {
    if (closed) return;
    closed = true;
    events.close(info);
  };
  ws.onopen = () => events.open();
  ws.onmessage = (event: MessageEvent) => {
    if (closed) return;
    const data = event.data as unknown;
    events.message(typeof data === "string" ? data : new Uint8Array(data as ArrayBuffer));
  };
  // An error is always followed by a close event; the close event carries what we need.
  ws.onerror = () => {};
  ws.onclose = (event: CloseEvent) => finish({ code: event.code, reason: event.reason });
  return {
    send: (data) => ws.send(data),
    close: (code = 1000, reason = "") => ws.close(code, reason),
    abort: () => {
      // A script cannot cut a WebSocket without a close frame; close it and report the
      // loss now rather than after the closing handshake.
      ws.close(4000, "abort");
      finish({ code: 1006, reason: "aborted" });
    },
  };
};

/**
 * A minimal WebSocket client (RFC 6455) over `node:net` / `node:tls`, for Node: every
 * `wss://` URL, and `ws://` where Node has no global `WebSocket` (Node < 22). Only the
 * Node entry imports it.
 *
 * It does what the hongbao client needs and what the RFC requires of a client: the
 * opening handshake (with the `Sec-WebSocket-Accept` check), masked frames out, text and
 * binary messages in (fragmented ones assembled), pongs to pings, and the closing
 * handshake. It also reports what a browser's WebSocket hides: the status and
 * `Retry-After` of a refused upgrade (the gateway answers `503` with `Retry-After: 1` when
 * it holds too many connections not yet logged in), so the client can wait as told.
 *
 * Over TLS (`wss://`) it trusts the CA given as `ca` (else Node's own list), checks the
 * certificate names the URL's host (or IP address), and offers ALPN `http/1.1`, as the
 * gateway's WebSocket listeners say. A failure no retry mends — an untrusted
 * certificate, a refused handshake, or a TLS alert answering a plain `ws://` handshake —
 * is reported as such (`CloseInfo.tls`), so the client stops instead of retrying.
 */

import { createHash, randomBytes, randomFillSync } from "node:crypto";
import * as net from "node:net";
import * as tls from "node:tls";

import type { CloseInfo, SocketEvents, SocketFactory, WireSocket } from "./socket.js";
import { isTlsAlert, plainAtTlsPort, tlsFailureOf } from "./tls-failure.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** Largest handshake answer we read. */
const MAX_HEAD_BYTES = 8192;
/** Largest message we assemble; the gateway's are at most 32 KiB. */
const MAX_MESSAGE_BYTES = 1 << 20;
/** How long a close waits for the server's close frame before cutting the connection. */
const CLOSE_WAIT_MS = 1000;

const OP_CONTINUATION = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
const OP_PING = 0x9;
const OP_PONG = 0xa;

/** A CA to trust, as PEM (one or several certificates), for `wss://`. */
export type TrustedCa = string | Uint8Array | (string | Uint8Array)[];

export interface NodeSocketOptions {
  /** The CA(s) that sign the server's certificate; without it, Node's own list. */
  ca?: TrustedCa;
}

/** Sockets that trust `options.ca` over `wss://`. */
export function nodeSocketWith(options: NodeSocketOptions): SocketFactory {
  return (url, events) => new NodeWebSocket(url, events, options);
}

/** Sockets that trust Node's own list of CAs over `wss://`. */
export const nodeSocket: SocketFactory = nodeSocketWith({});

/** `ca` as `node:tls` takes it. */
export function tlsCa(ca: TrustedCa): string | Buffer | (string | Buffer)[] {
  const one = (c: string | Uint8Array) => (typeof c === "string" ? c : Buffer.from(c.buffer, c.byteOffset, c.byteLength));
  return Array.isArray(ca) ? ca.map(one) : one(ca);
}

type Phase = "handshake" | "open" | "closing" | "closed";

class NodeWebSocket implements WireSocket {
  private readonly socket: net.Socket;
  private readonly key = randomBytes(16).toString("base64");
  private phase: Phase = "handshake";
  private input: Buffer = Buffer.alloc(0);
  /** Fragments of the message being assembled, and its opcode. */
  private fragments: Buffer[] = [];
  private fragmentsLen = 0;
  private fragmentOp = 0;
  private closeInfo: CloseInfo | undefined;
  private closeTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    url: string,
    private readonly events: SocketEvents,
    options: NodeSocketOptions,
  ) {
    const u = new URL(url);
    if (u.protocol !== "ws:" && u.protocol !== "wss:") throw new Error(`not a WebSocket URL: ${url}`);
    const secure = u.protocol === "wss:";
    const host = u.hostname.replace(/^\[|\]$/g, "");
    const port = Number(u.port || (secure ? 443 : 80));
    // An IP address gets no SNI (RFC 6066), and is checked against the certificate's
    // IP addresses.
    this.socket = secure
      ? tls.connect({
          host,
          port,
          servername: net.isIP(host) ? undefined : host,
          ALPNProtocols: ["http/1.1"],
          ...(options.ca !== undefined ? { ca: tlsCa(options.ca) } : {}),
        })
      : net.connect({ host, port });
    this.socket.setNoDelay(true);
    const path = (u.pathname || "/") + u.search;
    this.socket.once(secure ? "secureConnect" : "connect", () => {
      this.socket.write(
        `GET ${path} HTTP/1.1\r\nHost: ${u.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
          `Sec-WebSocket-Key: ${this.key}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
    });
    this.socket.on("data", (chunk: Buffer) => this.onData(chunk));
    this.socket.on("error", (e) => {
      // "close" follows; a TLS failure no retry mends is kept for it to report.
      const why = this.phase === "handshake" ? tlsFailureOf(e, "wss://") : undefined;
      if (why !== undefined) this.closeInfo = { code: 1006, reason: why, tls: why };
    });
    this.socket.on("close", () => this.finish({ code: 1006, reason: "connection lost" }));
  }

  send(data: string | Uint8Array): void {
    if (this.phase !== "open") return;
    if (typeof data === "string") this.writeFrame(OP_TEXT, Buffer.from(data, "utf8"));
    else this.writeFrame(OP_BINARY, data);
  }

  close(code = 1000, reason = ""): void {
    if (this.phase === "handshake") return this.abort();
    if (this.phase !== "open") return;
    const payload = Buffer.alloc(2 + Buffer.byteLength(reason));
    payload.writeUInt16BE(code, 0);
    payload.write(reason, 2);
    this.writeFrame(OP_CLOSE, payload);
    this.phase = "closing";
    this.closeInfo = { code, reason };
    this.closeTimer = setTimeout(() => this.socket.destroy(), CLOSE_WAIT_MS);
  }

  abort(): void {
    this.socket.destroy();
    this.finish({ code: 1006, reason: "aborted" });
  }

  /**
   * Reports `info` once. The TCP connection is cut now unless it was ended gracefully
   * (`socket.end()`, so what was written still goes out); then it gets a moment to close.
   */
  private finish(info: CloseInfo, graceful = false): void {
    if (this.phase === "closed") return;
    this.phase = "closed";
    clearTimeout(this.closeTimer);
    if (graceful) setTimeout(() => this.socket.destroy(), CLOSE_WAIT_MS).unref();
    else this.socket.destroy();
    this.events.close(this.closeInfo ?? info);
  }

  private fail(code: number, reason: string): void {
    if (this.phase === "open") {
      const payload = Buffer.alloc(2 + reason.length);
      payload.writeUInt16BE(code, 0);
      payload.write(reason, 2, "latin1");
      this.writeFrame(OP_CLOSE, payload);
    }
    this.closeInfo = { code, reason };
    this.socket.end();
    this.finish({ code, reason }, true);
  }

  private onData(chunk: Buffer): void {
    this.input = this.input.length === 0 ? chunk : Buffer.concat([this.input, chunk]);
    if (this.phase === "handshake" && !this.readHandshake()) return;
    while (this.phase === "open" || this.phase === "closing") {
      if (!this.readFrame()) return;
    }
  }

  /** Reads the upgrade answer; false while it is not whole (or it was refused). */
  private readHandshake(): boolean {
    if (isTlsAlert(this.input)) {
      const why = plainAtTlsPort("wss://");
      this.closeInfo = { code: 1006, reason: why, tls: why };
      this.finish(this.closeInfo);
      return false;
    }
    const end = this.input.indexOf("\r\n\r\n");
    if (end < 0) {
      if (this.input.length > MAX_HEAD_BYTES) this.refused(0, undefined, "handshake answer too long");
      return false;
    }
    const lines = this.input.subarray(0, end).toString("latin1").split("\r\n");
    this.input = this.input.subarray(end + 4);
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(lines[0] ?? "")?.[1] ?? 0);
    const headers = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":");
      if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
    }
    if (status !== 101) {
      const retryAfter = Number(headers.get("retry-after"));
      this.refused(status, Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter * 1000 : undefined, lines[0] ?? "");
      return false;
    }
    const accept = createHash("sha1").update(this.key + GUID).digest("base64");
    if (headers.get("sec-websocket-accept") !== accept || headers.get("upgrade")?.toLowerCase() !== "websocket") {
      this.refused(status, undefined, "bad upgrade answer");
      return false;
    }
    this.phase = "open";
    this.events.open();
    return true;
  }

  private refused(status: number, retryAfterMs: number | undefined, reason: string): void {
    this.closeInfo = { code: 1006, reason: `upgrade refused: ${reason}`, status };
    if (retryAfterMs !== undefined) this.closeInfo.retryAfterMs = retryAfterMs;
    this.finish(this.closeInfo);
  }

  /** Reads one frame from `input`; false when it is not whole yet (or the socket failed). */
  private readFrame(): boolean {
    const buf = this.input;
    if (buf.length < 2) return false;
    const fin = (buf[0]! & 0x80) !== 0;
    const op = buf[0]! & 0x0f;
    if ((buf[0]! & 0x70) !== 0) return this.failed(1002, "reserved bit set");
    if ((buf[1]! & 0x80) !== 0) return this.failed(1002, "masked server frame");
    let len = buf[1]! & 0x7f;
    let at = 2;
    if (len === 126) {
      if (buf.length < 4) return false;
      len = buf.readUInt16BE(2);
      at = 4;
    } else if (len === 127) {
      if (buf.length < 10) return false;
      const big = buf.readBigUInt64BE(2);
      if (big > BigInt(MAX_MESSAGE_BYTES)) return this.failed(1009, "message too big");
      len = Number(big);
      at = 10;
    }
    if (len > MAX_MESSAGE_BYTES) return this.failed(1009, "message too big");
    if (buf.length < at + len) return false;
    const payload = buf.subarray(at, at + len);
    this.input = buf.subarray(at + len);
    if (op >= 0x8) return this.control(op, fin, payload);
    if (op === OP_CONTINUATION) {
      if (this.fragments.length === 0) return this.failed(1002, "continuation with no message");
    } else if (op === OP_TEXT || op === OP_BINARY) {
      if (this.fragments.length !== 0) return this.failed(1002, "new message inside a fragmented one");
      this.fragmentOp = op;
    } else {
      return this.failed(1002, `unknown opcode ${op}`);
    }
    this.fragments.push(payload);
    this.fragmentsLen += payload.length;
    if (this.fragmentsLen > MAX_MESSAGE_BYTES) return this.failed(1009, "message too big");
    if (!fin) return true;
    const message = this.fragments.length === 1 ? payload : Buffer.concat(this.fragments);
    this.fragments = [];
    this.fragmentsLen = 0;
    if (this.phase !== "open") return true; // closing: what comes now is not read
    if (this.fragmentOp === OP_TEXT) {
      let text: string;
      try {
        text = utf8.decode(message);
      } catch {
        return this.failed(1007, "text message not UTF-8");
      }
      this.events.message(text);
    } else {
      this.events.message(new Uint8Array(message.buffer, message.byteOffset, message.length));
    }
    return this.phase === "open" || this.phase === "closing";
  }

  private control(op: number, fin: boolean, payload: Buffer): boolean {
    if (!fin || payload.length > 125) return this.failed(1002, "bad control frame");
    switch (op) {
      case OP_PING:
        if (this.phase === "open") this.writeFrame(OP_PONG, payload);
        return true;
      case OP_PONG:
        return true;
      case OP_CLOSE: {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        const reason = payload.length > 2 ? payload.subarray(2).toString("utf8") : "";
        if (this.phase === "open") {
          // Echo the code, as the RFC asks, then let the server close the TCP connection.
          const echo = payload.length >= 2 ? payload.subarray(0, 2) : Buffer.alloc(0);
          this.writeFrame(OP_CLOSE, echo);
        }
        this.closeInfo ??= { code, reason };
        this.socket.end();
        this.finish({ code, reason }, true);
        return false;
      }
      default:
        return this.failed(1002, `unknown opcode ${op}`);
    }
  }

  private failed(code: number, reason: string): false {
    this.fail(code, reason);
    return false;
  }

  /** Writes one masked frame (clients must mask every frame). */
  private writeFrame(op: number, payload: Uint8Array): void {
    const len = payload.length;
    const headLen = len < 126 ? 2 : len < 65536 ? 4 : 10;
    const frame = Buffer.allocUnsafe(headLen + 4 + len);
    frame[0] = 0x80 | op;
    if (len < 126) {
      frame[1] = 0x80 | len;
    } else if (len < 65536) {
      frame[1] = 0x80 | 126;
      frame.writeUInt16BE(len, 2);
    } else {
      frame[1] = 0x80 | 127;
      frame.writeBigUInt64BE(BigInt(len), 2);
    }
    const mask = nextMask();
    mask.copy(frame, headLen);
    for (let i = 0; i < len; i++) frame[headLen + 4 + i] = payload[i]! ^ mask[i & 3]!;
    this.socket.write(frame);
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

// Masks come from a pool of random bytes, refilled a page at a time: one random-number
// call per frame would cost more than the frame.
const maskPool = Buffer.alloc(4096);
let maskAt = maskPool.length;

function nextMask(): Buffer {
  if (maskAt + 4 > maskPool.length) {
    randomFillSync(maskPool);
    maskAt = 0;
  }
  const mask = maskPool.subarray(maskAt, maskAt + 4);
  maskAt += 4;
  return mask;
}

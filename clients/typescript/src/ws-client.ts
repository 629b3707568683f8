/**
 * The WebSocket transport: one connection at a time, logged in as one user, replies
 * matched to requests by request id (the gateway answers out of order), pushes turned
 * into events, and a new connection after a lost one.
 *
 * A request lives in one of two places: `queued` (no logged-in connection yet: it goes
 * out after the next login) or `inFlight` (sent on this connection, by request id). When
 * a connection is lost, sends and opens in flight go back to the front of the queue —
 * a send keeps its idempotency key, so the retry moves no money twice — and shakes,
 * chats and pings reject with `connection-lost` (their outcome is unknown). Every
 * request has its own deadline, reconnects included.
 *
 * Reconnecting (`backoff.ts`): a lost connection, a refused one, or an attempt with no
 * login answered within `dialTimeoutMs` (a server whose accept queue is full does not
 * answer the SYN) is tried again after a full-jitter back-off whose window doubles per
 * failed attempt; where the server said when to come back — the `retry_after_ms` of a
 * kick that comes back (`idle`, `slow-reader`, `shutdown`, `bad-frame`), a refused
 * upgrade's `Retry-After` — after ½× to 1½× of that, and the failed attempts are not
 * counted up. A login resets the count. Never after a refused token, a `replaced` kick
 * (another connection of this user is the one that counts now), an `expired` one (the app
 * gave no fresh token to come back with) or a `revoked` one (the user must sign in to the
 * app again), whatever wait it names, nor after a TLS failure no retry mends (an
 * untrusted certificate, a plain `ws://` at a TLS port: the socket says so,
 * `CloseInfo.tls`).
 *
 * Tokens: when the server pushes `refresh`, the client asks the app's `refresh` callback
 * (`credentials.ts`) for a fresh token and logs in with it on the same connection — the
 * session goes on, nothing is lost. The token the server took is the one every later
 * login uses.
 */

import { Backoff } from "./backoff.js";
import { Client, type Settings } from "./client.js";
import type { TimerHandle } from "./clock.js";
import { HongbaoError } from "./errors.js";
import { FrameError, check, decode, encode } from "./frame.js";
import { JsonFormError, fromJson, toJson } from "./json.js";
import type { ClientMessage, Frame, KickReason, Push, Reply } from "./protocol.js";
import { isPush, isReply } from "./protocol.js";
import {
  chatFromReply,
  openFromReply,
  pingFromReply,
  sendFromReply,
  shakeFromReply,
  type ChatResult,
  type OpenResult,
  type PingResult,
  type SendResult,
  type ShakeResult,
} from "./results.js";
import type { CloseInfo, SocketFactory, WireSocket } from "./socket.js";

interface Pending {
  message: ClientMessage;
  /** Sent again after a reconnect: a keyed send, an open. */
  resend: boolean;
  timer: TimerHandle;
  settle(outcome: Reply | HongbaoError): void;
}

/** The live connection and what belongs to it alone. */
interface Connection {
  socket: WireSocket;
  loginId: number;
  loggedIn: boolean;
  /** The kick that preceded the close, if any, and the wait it named before coming back. */
  kick: KickReason | undefined;
  kickRetryAfterMs: number | undefined;
  /** Aborts an attempt that has not logged in within `dialTimeoutMs`. */
  dialTimer: TimerHandle | undefined;
  loginRefused: boolean;
  /** A `rate-limited` login's wait: the next connection waits it out whole. */
  loginLimitMs: number | undefined;
}

export class WsClient extends Client {
  readonly transport = "websocket" as const;
  private conn: Connection | undefined;
  private nextId = 1;
  private readonly inFlight = new Map<number, Pending>();
  private queued: Pending[] = [];
  private readonly backoff: Backoff;
  private reconnectTimer: TimerHandle | undefined;
  private keepAliveTimer: TimerHandle | undefined;
  private firstLogin: { resolve(): void; reject(e: HongbaoError): void } | undefined;

  constructor(
    settings: Settings,
    noticeMemory: number,
    private readonly url: string,
    private readonly form: "binary" | "json",
    private readonly sockets: SocketFactory,
  ) {
    super(settings, noticeMemory);
    this.backoff = new Backoff(settings.reconnectBaseMs, settings.reconnectMaxMs, settings.random);
  }

  async setToken(token: string): Promise<void> {
    if (this.state === "closed") throw new HongbaoError("closed", "client", "the client is closed");
    if (!this.conn?.loggedIn) {
      this.credentials.token = token;
      return;
    }
    const reply = await this.login(token);
    if (reply.type === "login-reply" && reply.result === "ok") {
      this.credentials.token = token;
      return;
    }
    const kind = reply.type === "login-reply" && reply.result === "bad-token" ? "bad-token" : "protocol";
    throw new HongbaoError(kind, "server", `the fresh token was answered ${describe(reply)}; the session keeps its old one`);
  }

  /** Connects and logs in; resolves at the first login, retrying lost connections meanwhile. */
  start(): Promise<void> {
    const clock = this.settings.clock;
    return new Promise((resolve, reject) => {
      const timer = clock.setTimeout(() => {
        this.finish("timeout", `no login within ${this.settings.connectTimeoutMs} ms`, "network");
      }, this.settings.connectTimeoutMs);
      this.firstLogin = {
        resolve: () => {
          clock.clearTimeout(timer);
          resolve();
        },
        reject: (e) => {
          clock.clearTimeout(timer);
          reject(e);
        },
      };
      this.dial();
    });
  }

  async ping(): Promise<PingResult> {
    const startedMs = performance.now();
    const clientTimeUs = BigInt(Date.now()) * 1000n;
    const reply = await this.request({ type: "ping", clientTimeUs }, false);
    return pingFromReply(reply, performance.now() - startedMs);
  }

  async close(): Promise<void> {
    this.finish("closed", "closed by the client", "client");
  }

  /**
   * Drops the current connection as a network failure would (no close frame): requests
   * in flight are treated as lost and the client reconnects. For tests and chaos drills.
   */
  dropConnection(): void {
    this.conn?.socket.abort();
  }

  protected async shakeOnce(): Promise<ShakeResult> {
    return shakeFromReply(await this.request({ type: "shake" }, false));
  }

  protected async sendOnce(amountCents: bigint, shares: number, recipients: bigint[], key: string): Promise<SendResult> {
    const reply = await this.request({ type: "send", amountCents, shares, recipients, idempotencyKey: key }, true);
    return sendFromReply(reply, key);
  }

  protected async openOnce(packetId: bigint): Promise<OpenResult> {
    return openFromReply(await this.request({ type: "open", packetId }, true), packetId);
  }

  protected async chatOnce(toUser: bigint, text: string): Promise<ChatResult> {
    return chatFromReply(await this.request({ type: "chat", toUser, text }, false));
  }

  // ----- requests ---------------------------------------------------------------------

  private request(message: ClientMessage, resend: boolean): Promise<Reply> {
    return new Promise((resolve, reject) => {
      if (this.state === "closed") {
        reject(new HongbaoError("closed", "client", "the client is closed"));
        return;
      }
      const pending: Pending = {
        message,
        resend,
        timer: this.settings.clock.setTimeout(() => this.expire(pending), this.settings.requestTimeoutMs),
        settle: (outcome) => {
          this.settings.clock.clearTimeout(pending.timer);
          if (outcome instanceof HongbaoError) reject(outcome);
          else resolve(outcome);
        },
      };
      if (this.conn?.loggedIn) {
        this.transmit(this.conn, pending);
      } else if (this.queued.length >= this.settings.maxQueued) {
        pending.settle(new HongbaoError("queue-full", "client", `${this.queued.length} requests already wait for a connection`));
      } else {
        this.queued.push(pending);
      }
    });
  }

  private transmit(conn: Connection, pending: Pending): void {
    const id = this.allocateId();
    this.inFlight.set(id, pending);
    this.write(conn, { requestId: id, message: pending.message });
  }

  private write(conn: Connection, frame: Frame): void {
    conn.socket.send(this.form === "json" ? toJson(frame) : encode(frame));
  }

  /** Request ids count from 1 and wrap, skipping 0 (pushes) and ids still in flight. */
  private allocateId(): number {
    for (;;) {
      const id = this.nextId;
      this.nextId = id >= 0xffffffff ? 1 : id + 1;
      if (!this.inFlight.has(id) && id !== this.conn?.loginId) return id;
    }
  }

  private expire(pending: Pending): void {
    for (const [id, p] of this.inFlight) {
      if (p === pending) this.inFlight.delete(id);
    }
    this.queued = this.queued.filter((p) => p !== pending);
    pending.settle(new HongbaoError("timeout", "network", `no answer to ${pending.message.type} in ${this.settings.requestTimeoutMs} ms`));
  }

  // ----- the connection -----------------------------------------------------------------

  private dial(): void {
    this.reconnectTimer = undefined;
    if (this.state === "closed") return;
    let conn: Connection | undefined;
    const socket = this.sockets(this.url, {
      open: () => conn && this.opened(conn),
      message: (data) => conn && this.received(conn, data),
      close: (info) => conn && this.lost(conn, info),
    });
    conn = {
      socket,
      loginId: 0,
      loggedIn: false,
      kick: undefined,
      kickRetryAfterMs: undefined,
      loginRefused: false,
      loginLimitMs: undefined,
      dialTimer: undefined,
    };
    this.conn = conn;
    const attempt = conn;
    // Refused and reset connections end by themselves; one whose SYN, TLS handshake,
    // upgrade or login is never answered would hang here for minutes (the kernel's SYN
    // retries): cut it, and let the back-off space the next attempt.
    conn.dialTimer = this.settings.clock.setTimeout(() => {
      if (attempt === this.conn && !attempt.loggedIn) attempt.socket.abort();
    }, this.settings.dialTimeoutMs);
  }

  private opened(conn: Connection): void {
    if (conn !== this.conn) return;
    conn.loginId = this.allocateId();
    // A token that has ended is swapped for a fresh one first (a reconnect long after the
    // last refresh); one still alive logs in as it is, and the server asks in time.
    this.credentials.forLogin().then((token) => {
      if (conn !== this.conn) return;
      this.write(conn, { requestId: conn.loginId, message: { type: "login", userId: this.credentials.loginUserId, token: utf8.encode(token) } });
    });
  }

  /** A login on the logged-in connection with `token`: the server's answer. */
  private login(token: string): Promise<Reply> {
    return this.request({ type: "login", userId: this.credentials.loginUserId, token: utf8.encode(token) }, false);
  }

  /**
   * Answers the server's `refresh`: a fresh token from the app, and a login with it on
   * the same connection. Without one the session lapses at its token's end, and the kick
   * `expired` ends the client (the close reason says why no token came).
   */
  private async refreshSession(conn: Connection): Promise<void> {
    const fresh = await this.credentials.ask();
    if (fresh === undefined || conn !== this.conn) return;
    try {
      const reply = await this.login(fresh);
      if (reply.type === "login-reply" && reply.result === "ok") this.credentials.token = fresh;
      // Else the server keeps the session's old token until it ends.
      else this.credentials.lastFailure = `the fresh token was answered ${describe(reply)}`;
    } catch (e) {
      this.credentials.lastFailure = `logging in with the fresh token: ${(e as Error).message}`;
    }
  }

  private received(conn: Connection, data: string | Uint8Array): void {
    if (conn !== this.conn) return;
    let frame: Frame;
    try {
      frame = this.decodeMessage(data);
    } catch (e) {
      this.unreadable(conn, e);
      return;
    }
    const { requestId, message } = frame;
    if (requestId === 0) {
      if (isPush(message)) this.pushed(conn, message);
      return;
    }
    if (!isReply(message)) return;
    if (requestId === conn.loginId) {
      this.loginAnswered(conn, message);
      return;
    }
    const pending = this.inFlight.get(requestId);
    if (pending === undefined) return; // answered after its deadline
    this.inFlight.delete(requestId);
    pending.settle(message);
  }

  private decodeMessage(data: string | Uint8Array): Frame {
    if (typeof data === "string") return fromJson(data);
    // One binary message is exactly one frame.
    if (check(data) !== data.length) throw new FrameError("incomplete", "a binary message that is not one whole frame");
    return decode(data);
  }

  /** What the server sent is not the protocol: fail the request it names, or the connection. */
  private unreadable(conn: Connection, e: unknown): void {
    const requestId = e instanceof FrameError || e instanceof JsonFormError ? e.requestId : undefined;
    const pending = requestId ? this.inFlight.get(requestId) : undefined;
    const why = `unreadable message from the server: ${(e as Error).message}`;
    if (pending && !(e instanceof FrameError && e.fatal)) {
      this.inFlight.delete(requestId!);
      pending.settle(new HongbaoError("protocol", "server", why, { cause: e }));
      return;
    }
    // Nothing to pin it on, or the stream is broken: start over on a new connection.
    conn.socket.abort();
  }

  private loginAnswered(conn: Connection, reply: Reply): void {
    if (reply.type === "login-reply" && reply.result === "ok") {
      conn.loggedIn = true;
      this.settings.clock.clearTimeout(conn.dialTimer);
      this.credentials.userId = reply.userId;
      // Logged in: the trouble before is over (gRPC's rule), the next failure starts
      // from the first window.
      this.backoff.reset();
      this.setState("open", "logged in");
      this.firstLogin?.resolve();
      this.firstLogin = undefined;
      const queued = this.queued;
      this.queued = [];
      for (const pending of queued) this.transmit(conn, pending);
      this.keepAlive(conn);
      return;
    }
    if (reply.type === "login-reply" && reply.result === "bad-token") {
      // The server kicks and closes next; `lost` ends the client then.
      conn.loginRefused = true;
      return;
    }
    // Over the user's login limit (a bot reconnecting to refill its shakes): come back
    // once the wait is over, not before.
    if (reply.type === "error" && reply.result === "rate-limited") conn.loginLimitMs = reply.retryAfterMs;
    // `unavailable` (the core could not be reached) or anything else: try another connection.
    conn.socket.close(1000, "login failed");
  }

  private pushed(conn: Connection, push: Push): void {
    switch (push.type) {
      case "packet-notice":
        this.announce({
          packetId: push.packetId,
          fromUser: push.fromUser === 0n ? null : push.fromUser,
          amountCents: push.amountCents,
          shares: push.shares,
          expiresAtMs: push.expiresAtMs,
        });
        return;
      case "chat-message":
        this.events.emit("chat", { fromUser: push.fromUser, text: push.text });
        return;
      case "broadcast":
        this.events.emit("broadcast", { serverTimeUs: push.serverTimeUs, text: push.text });
        return;
      case "kick":
        // The close follows; `lost` decides from the reason whether to come back, and when.
        conn.kick = push.reason;
        conn.kickRetryAfterMs = push.retryAfterMs;
        this.events.emit("kick", { reason: push.reason, text: push.text, retryAfterMs: push.retryAfterMs });
        return;
      case "refresh":
        this.events.emit("refresh", { expiresAtMs: push.expiresAtMs });
        void this.refreshSession(conn);
        return;
    }
  }

  private keepAlive(conn: Connection): void {
    const clock = this.settings.clock;
    clock.clearTimeout(this.keepAliveTimer);
    if (this.settings.keepAliveMs <= 0) return;
    this.keepAliveTimer = clock.setTimeout(() => {
      if (conn !== this.conn || !conn.loggedIn) return;
      this.keepAlive(conn);
      this.ping().then(
        (r) => {
          if (r.result !== "ok") conn.socket.abort();
        },
        (e: HongbaoError) => {
          // No pong in time: the connection is dead even if the OS has not noticed.
          if (e.kind === "timeout" && conn === this.conn) conn.socket.abort();
        },
      );
    }, this.settings.keepAliveMs);
  }

  private lost(conn: Connection, info: CloseInfo): void {
    if (conn !== this.conn) return;
    this.conn = undefined;
    this.settings.clock.clearTimeout(conn.dialTimer);
    this.settings.clock.clearTimeout(this.keepAliveTimer);
    // Sends and opens go out again after the next login, ahead of what queued meanwhile.
    const again: Pending[] = [];
    for (const pending of this.inFlight.values()) {
      if (pending.resend) {
        again.push(pending);
      } else {
        const what = pending.message.type;
        pending.settle(new HongbaoError("connection-lost", "network", `the connection was lost with a ${what} in flight; its outcome is unknown`));
      }
    }
    this.inFlight.clear();
    this.queued = again.concat(this.queued);
    if (this.state === "closed") return;
    if (info.tls !== undefined) {
      this.finish("tls", `${this.url}: ${info.tls}`, "network");
      return;
    }
    if (conn.loginRefused || conn.kick === "bad-token") {
      this.finish("bad-token", `${this.whoseToken()} was refused`, "server");
      return;
    }
    if (conn.kick === "replaced") {
      this.finish("replaced", `user ${this.userId} logged in on another connection`, "server");
      return;
    }
    if (conn.kick === "expired") {
      const why = this.credentials.lastFailure ?? (this.credentials.canRefresh ? "no fresh token came" : "no refresh option was given to connect");
      this.finish("expired", `user ${this.userId}'s session ended with its token (${why})`, "server");
      return;
    }
    if (conn.kick === "revoked") {
      this.finish("revoked", `user ${this.userId}'s tokens were revoked`, "server");
      return;
    }
    const why = conn.kick ? `kicked: ${conn.kick}` : `closed ${info.code}${info.reason ? " " + info.reason : ""}`;
    if (this.state !== "connecting") this.setState("reconnecting", why);
    // The server's word on when to come back, if it gave one: a come-back kick's, or a
    // refused upgrade's `Retry-After`.
    const hintMs = conn.kick !== undefined ? conn.kickRetryAfterMs : info.retryAfterMs;
    const delay = this.backoff.next(hintMs, conn.loginLimitMs);
    this.reconnectTimer = this.settings.clock.setTimeout(() => this.dial(), delay);
  }

  /** Ends the client for good: every request waiting rejects with `kind`. */
  private finish(
    kind: "closed" | "bad-token" | "replaced" | "expired" | "revoked" | "tls" | "timeout",
    why: string,
    source: "client" | "server" | "network",
  ): void {
    if (this.state === "closed") return;
    this.setState("closed", why);
    this.settings.clock.clearTimeout(this.reconnectTimer);
    this.settings.clock.clearTimeout(this.keepAliveTimer);
    const conn = this.conn;
    this.conn = undefined;
    conn?.socket.close(1000, "bye");
    // A connect that timed out rejects `connect()` with `timeout`; requests queued behind
    // it were never sent and end with the client: `closed`.
    const error = () => new HongbaoError(kind === "timeout" ? "closed" : kind, source, why);
    for (const pending of [...this.inFlight.values(), ...this.queued]) pending.settle(error());
    this.inFlight.clear();
    this.queued = [];
    if (this.firstLogin) {
      this.firstLogin.reject(new HongbaoError(kind, source, why));
      this.firstLogin = undefined;
    }
  }
}

const utf8 = new TextEncoder();

/** A reply in a few words, for messages: `login-reply bad-token`. */
function describe(reply: Reply): string {
  return "result" in reply ? `${reply.type} ${reply.result}` : reply.type;
}

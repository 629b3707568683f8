/**
 * A simulated clock and a simulated gateway, for the reconnect tests: clients built by
 * the real `connectUsing` and `WsClient`, whose timers run on {@link SimClock} and whose
 * sockets are {@link SimGateway}'s. Nothing touches the network or the real clock, so a
 * thousand clients dropped at once reconnect in milliseconds of real time and every wait
 * can be read off exactly.
 */

import type { Clock, TimerHandle } from "../../src/clock.js";
import { connectUsing } from "../../src/connect.js";
import type { Client, ConnectOptions } from "../../src/client.js";
import { check, decode, encode } from "../../src/frame.js";
import type { KickReason, Message } from "../../src/protocol.js";
import type { CloseInfo, SocketEvents, WireSocket } from "../../src/socket.js";

/** Lets every promise already settled run its callbacks (and what those start in turn). */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

interface SimTimer {
  at: number;
  seq: number;
  fn: () => void;
}

/** A clock that moves only in {@link advance}, running its timers in order on the way. */
export class SimClock implements Clock {
  private now: number;
  private seq = 0;
  private readonly timers = new Map<number, SimTimer>();

  constructor(startMs = 1_000_000) {
    this.now = startMs;
  }

  nowMs(): number {
    return this.now;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const seq = ++this.seq;
    this.timers.set(seq, { at: this.now + Math.max(0, ms), seq, fn });
    return seq;
  }

  clearTimeout(handle: TimerHandle | undefined): void {
    if (typeof handle === "number") this.timers.delete(handle);
  }

  /** Timers still to run. */
  get pending(): number {
    return this.timers.size;
  }

  /**
   * Moves the clock `ms` forward, running each timer due on the way at its own time, in
   * order, and what its callbacks set off (promise callbacks included) before the next.
   */
  async advance(ms: number): Promise<void> {
    const end = this.now + ms;
    await settle();
    for (;;) {
      let next: SimTimer | undefined;
      for (const t of this.timers.values()) {
        if (t.at <= end && (next === undefined || t.at < next.at || (t.at === next.at && t.seq < next.seq))) next = t;
      }
      if (next === undefined) break;
      this.timers.delete(next.seq);
      this.now = next.at;
      next.fn();
      await settle();
    }
    this.now = end;
    await settle();
  }
}

/** What the gateway does with a new connection. */
export type DialAnswer =
  /** Upgrades it and answers the login `ok`. */
  | "accept"
  /** Nothing listens: refused (ECONNREFUSED). */
  | "refuse"
  /** Too many connections not logged in: `503` with `Retry-After` (`retryAfterMs`). */
  | "busy"
  /** Never answers (an accept queue that is full drops the SYN). */
  | "silent";

/** One connection, as the simulated gateway holds it. */
export class SimSocket implements WireSocket {
  loggedIn = false;
  closed = false;

  constructor(
    private readonly gateway: SimGateway,
    private readonly events: SocketEvents,
    readonly dialedAtMs: number,
    /** The user whose client dialed (known to the test, not to the gateway before a login). */
    readonly userId: number,
  ) {}

  send(data: string | Uint8Array): void {
    if (this.closed || typeof data === "string" || check(data) !== data.length) return;
    const { requestId, message } = decode(data);
    if (message.type === "login") {
      this.gateway.later(() => {
        if (this.closed) return;
        this.loggedIn = true;
        this.deliver(requestId, { type: "login-reply", result: "ok", userId: message.userId });
      });
    }
  }

  close(code = 1000, reason = ""): void {
    this.gateway.later(() => this.end({ code, reason }));
  }

  abort(): void {
    this.end({ code: 1006, reason: "aborted" });
  }

  /** The server's kick, then its close, as the gateway sends them. */
  kick(reason: KickReason, retryAfterMs?: number): void {
    const kick: Message = { type: "kick", reason, text: `kicked: ${reason}` };
    if (retryAfterMs !== undefined) kick.retryAfterMs = retryAfterMs;
    this.deliver(0, kick);
    this.end({ code: reason === "shutdown" ? 1001 : 1008, reason });
  }

  /** The connection dies without a word (a worker killed, a reset). */
  drop(): void {
    this.end({ code: 1006, reason: "connection lost" });
  }

  opened(): void {
    if (!this.closed) this.events.open();
  }

  end(info: CloseInfo): void {
    if (this.closed) return;
    this.closed = true;
    this.loggedIn = false;
    this.events.close(info);
  }

  private deliver(requestId: number, message: Message): void {
    if (!this.closed) this.events.message(encode({ requestId, message }));
  }
}

/**
 * The gateway's side of every simulated socket: what it answers a dial with (`answer`,
 * changed by the test as it goes) and when each dial came.
 */
export class SimGateway {
  answer: DialAnswer = "accept";
  /** The `Retry-After` of a `busy` answer. */
  retryAfterMs = 1000;
  /** One way, per step of a dial or a reply. */
  latencyMs = 1;
  readonly sockets: SimSocket[] = [];

  constructor(readonly clock: SimClock) {}

  /** The simulated time of every dial, in order. */
  get dials(): number[] {
    return this.sockets.map((s) => s.dialedAtMs);
  }

  /** The logged-in connections. */
  live(): SimSocket[] {
    return this.sockets.filter((s) => s.loggedIn);
  }

  later(fn: () => void): void {
    this.clock.setTimeout(fn, this.latencyMs);
  }

  dial(events: SocketEvents, userId: number): SimSocket {
    const socket = new SimSocket(this, events, this.clock.nowMs(), userId);
    this.sockets.push(socket);
    const answer = this.answer;
    const retryAfterMs = this.retryAfterMs;
    if (answer === "accept") this.later(() => socket.opened());
    if (answer === "refuse") this.later(() => socket.end({ code: 1006, reason: "connect ECONNREFUSED" }));
    if (answer === "busy") {
      this.later(() => socket.end({ code: 1006, reason: "upgrade refused: HTTP/1.1 503", status: 503, retryAfterMs }));
    }
    return socket;
  }

  /** A client of user `userId` on this gateway: `connect` as an app calls it. */
  connect(userId: number, options: Partial<ConnectOptions> = {}): Promise<Client> {
    const connect = connectUsing({ sockets: () => (_url, events) => this.dial(events, userId) });
    return connect({
      url: "ws://gateway.sim:7002/ws",
      token: "sim-token",
      userId,
      clock: this.clock,
      keepAliveMs: 0,
      ...options,
    });
  }
}

/** A seeded random source (mulberry32): storms that are the same at every run. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** How many of `timesMs` fall in each `widthMs` bucket from `fromMs`: the busiest count. */
export function busiestBucket(timesMs: number[], fromMs: number, widthMs: number): number {
  const counts = new Map<number, number>();
  for (const t of timesMs) {
    const b = Math.floor((t - fromMs) / widthMs);
    counts.set(b, (counts.get(b) ?? 0) + 1);
  }
  return Math.max(0, ...counts.values());
}

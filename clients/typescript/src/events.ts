/**
 * What the client tells its user without being asked: a small typed emitter, and the
 * memory of packets already announced, so that a notice the server repeats (at every
 * login, and in cluster mode after a failover: docs/protocol.md, "send") is delivered
 * once.
 */

import type { KickReason } from "./protocol.js";
import type { PacketNotice } from "./results.js";

/** The client's connection, as its user sees it. */
export type ClientState =
  /** Connecting and logging in for the first time. */
  | "connecting"
  /** Logged in: requests go out now. */
  | "open"
  /** The connection was lost; waiting out the back-off, then connecting again. */
  | "reconnecting"
  /** For good: `close()`, a refused token, or a kick `replaced`, `expired` or `revoked`. */
  | "closed";

export interface ClientEvents {
  "packet-notice": PacketNotice;
  chat: { fromUser: bigint; text: string };
  broadcast: { serverTimeUs: bigint; text: string };
  /**
   * The server is closing this connection, and why. `retryAfterMs`: when it asked the
   * client to come back (a server draining its connections on a restart spreads them);
   * undefined when it named no wait. The client reconnects by itself after `idle`,
   * `slow-reader`, `shutdown` and `bad-frame`, never after the others.
   */
  kick: { reason: KickReason; text: string; retryAfterMs: number | undefined };
  /**
   * The server asked for a fresh token: the session's token ends at `expiresAtMs` (Unix
   * ms). The client asks the `refresh` option for one and logs in again with it on the
   * same connection; with none, the session ends then (kick `expired`).
   */
  refresh: { expiresAtMs: bigint };
  state: { state: ClientState; reason: string };
}

export type Listener<T> = (event: T) => void;

export class Emitter<Events extends object> {
  private readonly listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Calls `listener` for every `event`; returns the function that stops it. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener as Listener<never>);
    return () => this.off(event, listener);
  }

  off<K extends keyof Events>(event: K, listener: Listener<Events[K]>): void {
    this.listeners.get(event)?.delete(listener as Listener<never>);
  }

  emit<K extends keyof Events>(event: K, value: Events[K]): void {
    for (const listener of this.listeners.get(event) ?? []) {
      try {
        (listener as Listener<Events[K]>)(value);
      } catch (e) {
        // A listener's bug must not break the connection that called it.
        queueMicrotask(() => {
          throw e;
        });
      }
    }
  }
}

/**
 * Packet ids already announced, the newest `capacity` of them (a bounded memory: the
 * oldest is forgotten first, and a packet old enough to be forgotten has long expired
 * or been opened).
 */
export class SeenPackets {
  private readonly ids = new Set<bigint>();

  constructor(private readonly capacity: number) {}

  /** True the first time `packetId` is offered. */
  firstTime(packetId: bigint): boolean {
    if (this.ids.has(packetId)) return false;
    this.ids.add(packetId);
    if (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value as bigint;
      this.ids.delete(oldest);
    }
    return true;
  }
}

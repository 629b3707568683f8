/**
 * The token a client logs in with, and how it gets a fresh one.
 *
 * A session lasts as long as its token (docs/protocol.md, "login"): before the token
 * ends the server pushes `refresh`, and the client logs in again on the same connection
 * with a fresh token from the app — the `refresh` callback of `connect`'s options, which
 * resolves to a new JWT (from the app server, typically) or to nothing, letting the
 * session lapse. A connection is only dialled with a token that has not ended (a
 * reconnect long after the last refresh asks the callback first); the server asks for
 * the next one in time. HTTP has no pushes, so there the callback is asked before a
 * request whenever the token is within `refreshBeforeMs` of its `exp`.
 *
 * One `Credentials` per client, shared by its connections and HTTP calls. It asks the
 * callback once at a time: callers that want a fresh token together share one call.
 */

import { tokenClaims } from "./token.js";

/**
 * The app's source of fresh tokens: called with the user id, resolves to a JWT, or to
 * null/undefined to let the session lapse (a throw or a rejection counts as that too).
 */
export type RefreshToken = (userId: bigint) => Promise<string | null | undefined> | string | null | undefined;

export class Credentials {
  /** The token every new login and HTTP request uses. */
  token: string;
  /** The user a login names: as given, or 0 ("whoever the token names"). */
  readonly loginUserId: bigint;
  /** The user: given, else the token's `sub`, else as the server named it at login. */
  userId: bigint;
  /** Why the last call of the callback gave nothing, in words (for the close reason). */
  lastFailure: string | undefined;
  private asking: Promise<string | undefined> | undefined;

  constructor(
    token: string,
    userId: bigint,
    private readonly refresh: RefreshToken | undefined,
    private readonly refreshBeforeMs: number,
  ) {
    this.token = token;
    this.loginUserId = userId;
    this.userId = userId !== 0n ? userId : (tokenClaims(token)?.userId ?? 0n);
  }

  get canRefresh(): boolean {
    return this.refresh !== undefined;
  }

  /** Whether the token's `exp` is at most `ms` away (or past); false when it names no end the client can read. */
  endsWithin(ms: number, nowMs = Date.now()): boolean {
    const expiresAtMs = tokenClaims(this.token)?.expiresAtMs;
    return expiresAtMs !== undefined && expiresAtMs - nowMs <= ms;
  }

  /** A fresh token from the app's callback, or undefined (`lastFailure` says why). Concurrent callers share one call. */
  ask(): Promise<string | undefined> {
    if (this.refresh === undefined) return Promise.resolve(undefined);
    this.asking ??= this.call(this.refresh).finally(() => {
      this.asking = undefined;
    });
    return this.asking;
  }

  private async call(refresh: RefreshToken): Promise<string | undefined> {
    let fresh: string | null | undefined;
    try {
      fresh = await refresh(this.userId);
    } catch (e) {
      // The app's code: its failure lets the session lapse.
      this.lastFailure = `the refresh callback failed: ${(e as Error)?.message ?? String(e)}`;
      return undefined;
    }
    if (fresh === null || fresh === undefined || fresh === "") {
      this.lastFailure = "the refresh callback gave no token";
      return undefined;
    }
    if (typeof fresh !== "string") {
      this.lastFailure = `the refresh callback gave a ${typeof fresh}, not a string`;
      return undefined;
    }
    this.lastFailure = undefined;
    return fresh;
  }

  /** The token for an HTTP request: a fresh one first when this one is within `refreshBeforeMs` of its end. */
  forRequest(): Promise<string> {
    return this.freshIfEndingWithin(this.refreshBeforeMs);
  }

  /** The token for a new connection's login: a fresh one first when this one has ended. */
  forLogin(): Promise<string> {
    return this.freshIfEndingWithin(0);
  }

  private async freshIfEndingWithin(ms: number): Promise<string> {
    if (this.refresh !== undefined && this.endsWithin(ms)) {
      const fresh = await this.ask();
      if (fresh !== undefined) this.token = fresh;
    }
    return this.token;
  }
}

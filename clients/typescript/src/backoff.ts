/**
 * Waiting as the server asks: the reconnect back-off and the shake gate. Plain arithmetic
 * with the random source passed in (and the time, where a wait needs it), so tests can
 * pin both.
 *
 * Reconnects use "full jitter" (AWS's name): after n failed attempts in a row the wait is
 * drawn uniformly from [0, min(cap, base × 2^n)). Clients dropped together (a worker that
 * died, a listener refusing connections) come back evenly over the whole window, N /
 * window of them per millisecond. For the same average wait that is twice as wide a
 * spread as ½× to 1½× of a mean (a window is twice its mean; ½–1½× is as wide as its
 * mean), so the peak a crowd makes is half as high.
 *
 * When the server says when to come back (a kick's `retry_after_ms` as it drains its
 * connections, a refused upgrade's or HTTP answer's `Retry-After`), that hint replaces the
 * step for that attempt, drawn from ½× to 1½× of it so that a crowd the server spread
 * stays spread; and it does not count as a failure: the count stays where it was.
 *
 * Shakes after `overloaded` are another rule (the shake gate below): ½× to 1½× of the
 * server's wait, as `hongbao load` draws it.
 */

export type Random = () => number;

/** A wait drawn uniformly from ½× to 1½× of `meanMs`. */
export function jittered(meanMs: number, random: Random = Math.random): number {
  return Math.round(meanMs * (0.5 + random()));
}

/** The first reconnect's window: a lost connection is tried again within half a second. */
export const DEFAULT_RECONNECT_BASE_MS = 500;
/** The widest window: a client that keeps failing still tries twice a minute on average. */
export const DEFAULT_RECONNECT_CAP_MS = 30_000;

/**
 * Reconnect delays: full jitter over a window that doubles from `baseMs` with every
 * failed attempt, up to `capMs`; the server's hint instead where it gave one. A login
 * that succeeds resets the count.
 */
export class Backoff {
  private failures = 0;

  constructor(
    readonly baseMs: number = DEFAULT_RECONNECT_BASE_MS,
    readonly capMs: number = DEFAULT_RECONNECT_CAP_MS,
    private readonly random: Random = Math.random,
  ) {}

  /** Failed attempts since the last reset (hinted waits not counted). */
  get attempts(): number {
    return this.failures;
  }

  /** The window the next unhinted wait is drawn from: min(cap, base × 2^attempts). */
  windowMs(): number {
    return Math.min(this.capMs, this.baseMs * 2 ** Math.min(this.failures, 30));
  }

  /**
   * The delay before the next attempt, never under `atLeastMs` (a per-user limit's wait:
   * coming back sooner is refused again). With `hintMs` (the server named when to come
   * back) it is drawn from ½× to 1½× of the hint and the count stays; without, it is drawn
   * from [0, window) and the attempt counts as failed.
   */
  next(hintMs?: number, atLeastMs?: number): number {
    let delay: number;
    if (hintMs !== undefined && hintMs > 0) {
      delay = jittered(hintMs, this.random);
    } else {
      delay = Math.floor(this.random() * this.windowMs());
      this.failures++;
    }
    return Math.max(delay, atLeastMs ?? 0);
  }

  reset(): void {
    this.failures = 0;
  }
}

/** The wait `hongbao load` takes when an `overloaded` answer names none. */
export const DEFAULT_OVERLOADED_WAIT_MS = 30_000;

/**
 * When shaking may resume after an `overloaded` answer: the server's `retry_after_ms`
 * (or {@link DEFAULT_OVERLOADED_WAIT_MS} when it named none), jittered; after a
 * `rate-limited` one (the user's own limit: no crowd to spread, and an early shake would
 * be refused again), exactly the wait named. Until then the client answers a shake
 * itself, sending nothing.
 */
export class ShakeGate {
  private notBeforeMs = 0;
  /** The answer that set the wait now running. */
  heldBy: "overloaded" | "rate-limited" = "overloaded";

  constructor(private readonly random: Random = Math.random) {}

  /** Milliseconds left before a shake may go to the server; 0 when it may go now. */
  heldForMs(nowMs: number): number {
    return Math.max(0, this.notBeforeMs - nowMs);
  }

  /** An `overloaded` answer came at `nowMs`, asking for `retryAfterMs` (null: no wait named). */
  overloaded(retryAfterMs: number | null, nowMs: number): void {
    this.hold(nowMs + jittered(retryAfterMs ?? DEFAULT_OVERLOADED_WAIT_MS, this.random), "overloaded");
  }

  /** A `rate-limited` answer came at `nowMs`, asking for `retryAfterMs` (null: none named, no wait). */
  rateLimited(retryAfterMs: number | null, nowMs: number): void {
    this.hold(nowMs + (retryAfterMs ?? 0), "rate-limited");
  }

  private hold(untilMs: number, by: "overloaded" | "rate-limited"): void {
    if (untilMs <= this.notBeforeMs) return;
    this.notBeforeMs = untilMs;
    this.heldBy = by;
  }
}

/**
 * Waiting as the server asks: the reconnect back-off and the shake gate. Plain arithmetic
 * with the clock and the random source passed in, so tests can pin both.
 *
 * Every wait is drawn uniformly from ½× to 1½× of its mean, as `hongbao load` draws
 * them: clients sent away together come back spread out, not in a wave.
 */

export type Random = () => number;

/** A wait drawn uniformly from ½× to 1½× of `meanMs`. */
export function jittered(meanMs: number, random: Random = Math.random): number {
  return Math.round(meanMs * (0.5 + random()));
}

/**
 * Reconnect delays: the mean doubles from `baseMs` with every failed attempt, up to
 * `maxMs`, and is never below what the server asked for (a `Retry-After`). A login that
 * succeeds resets it.
 */
export class Backoff {
  private attempt = 0;

  constructor(
    readonly baseMs: number,
    readonly maxMs: number,
    private readonly random: Random = Math.random,
  ) {}

  /**
   * The delay before the next attempt, never under `atLeastMs` (a per-user limit's wait:
   * coming back sooner is refused again); counts the attempt.
   */
  next(serverAskedMs?: number, atLeastMs?: number): number {
    const mean = Math.min(this.maxMs, this.baseMs * 2 ** Math.min(this.attempt, 30));
    this.attempt++;
    return Math.max(jittered(Math.max(mean, serverAskedMs ?? 0), this.random), atLeastMs ?? 0);
  }

  reset(): void {
    this.attempt = 0;
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

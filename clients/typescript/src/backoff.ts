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

  /** The delay before the next attempt; counts the attempt. */
  next(serverAskedMs?: number): number {
    const mean = Math.min(this.maxMs, this.baseMs * 2 ** Math.min(this.attempt, 30));
    this.attempt++;
    return jittered(Math.max(mean, serverAskedMs ?? 0), this.random);
  }

  reset(): void {
    this.attempt = 0;
  }
}

/** The wait `hongbao load` takes when an `overloaded` answer names none. */
export const DEFAULT_OVERLOADED_WAIT_MS = 30_000;

/**
 * When shaking may resume after an `overloaded` answer: the server's `retry_after_ms`
 * (or {@link DEFAULT_OVERLOADED_WAIT_MS} when it named none), jittered. Until then the
 * client answers a shake itself, sending nothing.
 */
export class ShakeGate {
  private notBeforeMs = 0;

  constructor(private readonly random: Random = Math.random) {}

  /** Milliseconds left before a shake may go to the server; 0 when it may go now. */
  heldForMs(nowMs: number): number {
    return Math.max(0, this.notBeforeMs - nowMs);
  }

  /** An `overloaded` answer came at `nowMs`, asking for `retryAfterMs` (null: no wait named). */
  overloaded(retryAfterMs: number | null, nowMs: number): void {
    const wait = jittered(retryAfterMs ?? DEFAULT_OVERLOADED_WAIT_MS, this.random);
    this.notBeforeMs = Math.max(this.notBeforeMs, nowMs + wait);
  }
}

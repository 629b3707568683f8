/**
 * The client's time and timers, as one value passed in: the platform's by default, a
 * simulated one in tests, where a thousand clients dropped at once reconnect on a clock
 * that moves only when the test says, and every wait can be read off exactly.
 *
 * Tokens (`credentials.ts`) and a ping's timestamps read the wall clock directly: they
 * are compared with the server's, which no test clock moves.
 */

/** What `setTimeout` returned: only ever handed back to `clearTimeout`. */
export type TimerHandle = unknown;

export interface Clock {
  /** Now, in milliseconds: the platform's is `Date.now()`; a test's starts where it likes. */
  nowMs(): number;
  /** Calls `fn` once, `ms` from now. */
  setTimeout(fn: () => void, ms: number): TimerHandle;
  /** Cancels a timer (undefined, or one that already ran: nothing happens). */
  clearTimeout(handle: TimerHandle | undefined): void;
}

export const platformClock: Clock = {
  nowMs: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout> | undefined),
};

/** Resolves `ms` from now on `clock`. */
export function sleepOn(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms));
}

"""When to try again: full-jitter back-off, the server's own waits, and the shake gate.

- `Backoff` spaces reconnects with "full jitter" (AWS's name): after n failed attempts in
  a row the wait is drawn uniformly from [0, min(cap, base × 2^n)). Clients dropped
  together (a worker that died, a listener refusing connections) come back evenly over
  the whole window, N / window of them a second. For the same average wait that is twice
  as wide a spread as ½× to 1½× of a mean (a window is twice its mean; ½–1½× is as wide
  as its mean), so the peak a crowd makes is half as high.
- Where the server says when to come back — a kick's `retry_after_ms` (a server draining
  its connections on a restart spreads them over a window), an HTTP `Retry-After` on a
  503 or 429 — that hint replaces the step for the attempt: ½× to 1½× of it, so that the
  crowd the server spread stays spread, and it is not counted as a failure (being sent
  away is not one).
- `ShakeGate` holds shakes back after an `overloaded` answer for the `retry_after_ms` the
  server asked, drawn from ½× to 1½× as `hongbao load` does (docs/protocol.md, shake):
  the server spreads its waits on purpose, and the jitter keeps them spread. After a
  `rate-limited` answer (this user's own limit) it holds them for exactly the wait
  named: the limit is the user's, there is no crowd to spread, and coming back early
  would only be refused again.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

#: The first reconnect's window: a lost connection is tried again within half a second.
DEFAULT_BASE_S = 0.5
#: The widest window: a client that keeps failing still tries twice a minute on average.
DEFAULT_CAP_S = 30.0


def jitter(seconds: float, rng: random.Random | None = None) -> float:
    """`seconds` give or take up to half, uniformly."""
    return seconds * (rng or random).uniform(0.5, 1.5)


@dataclass
class Backoff:
    base_s: float = DEFAULT_BASE_S
    cap_s: float = DEFAULT_CAP_S
    rng: random.Random = field(default_factory=random.Random)
    #: Failed attempts since the last reset (waits the server named are not counted).
    attempt: int = 0

    def window_s(self) -> float:
        """The window the next wait without a hint is drawn from: min(cap, base × 2^attempt)."""
        return min(self.cap_s, self.base_s * 2 ** min(self.attempt, 30))

    def next_delay(self, server_wait_s: float | None = None, *, at_least_s: float | None = None) -> float:
        """The wait before the next attempt, never under `at_least_s` (a per-user limit's
        wait). With `server_wait_s` (the server named when to come back) it is drawn from
        ½× to 1½× of that and the count stays; without, from [0, window), and the attempt
        counts as failed."""
        if server_wait_s is not None and server_wait_s > 0:
            delay = jitter(server_wait_s, self.rng)
        else:
            delay = self.rng.random() * self.window_s()
            self.attempt += 1
        return max(delay, at_least_s or 0.0)

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class ShakeGate:
    """The earliest time (monotonic) the server lets this user shake again."""

    #: The wait when an `overloaded` answer names none (the load generator's choice).
    default_wait_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    not_before: float = 0.0

    def overloaded(self, retry_after_ms: int | None) -> float:
        """Records an `overloaded` answer; returns the wait drawn, in seconds."""
        wait_s = retry_after_ms / 1000 if retry_after_ms else self.default_wait_s
        drawn = jitter(wait_s, self.rng)
        self.not_before = max(self.not_before, time.monotonic() + drawn)
        return drawn

    def rate_limited(self, retry_after_ms: int | None) -> float:
        """Records a `rate-limited` answer; returns the wait, in seconds."""
        wait_s = (retry_after_ms or 0) / 1000
        self.not_before = max(self.not_before, time.monotonic() + wait_s)
        return wait_s

    def wait_s(self) -> float:
        """Seconds until a shake may go out (0 when it may now)."""
        return max(0.0, self.not_before - time.monotonic())

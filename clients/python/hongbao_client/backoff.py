"""When to try again: jittered exponential back-off, and the server's own waits.

Two waits follow the server:

- `Backoff` spaces reconnects: base × 2^attempt (capped), each drawn uniformly from ½× to
  1½× so that clients dropped together (a worker that died, a restart) do not come back
  in one wave. When the server named a wait (HTTP `Retry-After`), that wait is used
  instead, with the same jitter.
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


def jitter(seconds: float, rng: random.Random | None = None) -> float:
    """`seconds` give or take up to half, uniformly."""
    return seconds * (rng or random).uniform(0.5, 1.5)


@dataclass
class Backoff:
    base_s: float = 0.2
    cap_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self, server_wait_s: float | None = None, *, at_least_s: float | None = None) -> float:
        """The wait before the next attempt, never under `at_least_s` (a per-user limit's
        wait); counts the attempt."""
        if server_wait_s is not None and server_wait_s > 0:
            delay = jitter(server_wait_s, self.rng)
        else:
            delay = jitter(min(self.cap_s, self.base_s * 2 ** min(self.attempt, 30)), self.rng)
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

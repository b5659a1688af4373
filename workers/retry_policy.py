"""When to try a failed batch again: a pure decision, apart from the I/O that runs it."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchRetryPolicy:
    """Capped exponential backoff with full jitter."""

    max_attempts: int = 3
    base_delay: float = 0.1
    max_delay: float = 2.0

    def delay_before(self, attempt: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait before attempt number ``attempt`` (2, 3, ...); None when the
        attempts are used up. Jitter spreads the retries of batches that failed together."""
        if attempt > self.max_attempts:
            return None
        if attempt <= 1:
            return 0.0
        cap = min(self.max_delay, self.base_delay * 2 ** (attempt - 2))
        return (rng or random).uniform(cap / 2, cap)

"""When to try a failed batch again: pure decisions, apart from the I/O that runs it."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from aiokafka.errors import KafkaError, KafkaTimeoutError
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Redis answering that it cannot take a write now (full at noeviction, loading its data
# after a restart, a replica until failover ends, a cluster between owners): an outage.
_REDIS_UNAVAILABLE = (
    OutOfMemoryError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    MasterDownError,
)


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says a backing service (Redis, the broker) is unreachable for now,
    so the same work may well succeed unchanged once it is back."""
    if isinstance(error, KafkaError):
        return bool(error.retriable) or isinstance(error, KafkaTimeoutError)
    return isinstance(
        error, (RedisConnectionError, RedisTimeoutError, asyncio.TimeoutError, ConnectionError, *_REDIS_UNAVAILABLE)
    )


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

    def after_run_failure(self, error: BaseException, failures: int, rng: random.Random | None = None) -> float | None:
        """Seconds to wait before running a batch again after its ``failures``-th failed
        run (not a model failure: the runner handles those); None to give up on it. An
        outage of Redis or the broker is waited out, paced, however long it lasts: giving
        up would fail tasks that can still complete. Anything else is a fault that
        repeating will not mend: after ``max_attempts`` runs the batch is given up."""
        if is_outage(error):
            return (rng or random).uniform(self.max_delay / 2, self.max_delay) if failures > 3 else self.base_delay
        return self.delay_before(failures + 1, rng)

"""The counters every batcher adds to and the API reads (``RedisKeys.stats``): batches,
rows, padding, failures and flush reasons, totalled across processes."""

from __future__ import annotations

from collections.abc import Mapping

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys


class StatsField:
    """Names of the counters in the stats hash, totalled across batchers."""

    BATCHES_DISPATCHED = "batches_dispatched"  # model calls made
    ROWS_DISPATCHED = "rows_dispatched"  # real rows in those calls (padding excluded)
    PADDED_SLOTS = "padded_slots"  # filler rows sent to reach the fixed batch size
    CALLS_FAILED = "calls_failed"  # model calls that raised
    TASKS_DONE = "tasks_done"
    TASKS_FAILED = "tasks_failed"
    TASKS_EXPIRED = "tasks_expired"  # deadline passed before dispatch: never computed

    CACHE_HITS = "cache_hits"  # tasks answered by an identical task's result, no row of their own
    CACHE_MISSES = "cache_misses"  # cacheable tasks the model computed

    ALL = (
        BATCHES_DISPATCHED,
        ROWS_DISPATCHED,
        PADDED_SLOTS,
        CALLS_FAILED,
        TASKS_DONE,
        TASKS_FAILED,
        TASKS_EXPIRED,
        CACHE_HITS,
        CACHE_MISSES,
    )
    FLUSHES_PREFIX = "flushes_"

    @staticmethod
    def flushes(reason: str) -> str:
        """Counter of batches flushed for ``reason`` (full, deadline, ...)."""
        return f"{StatsField.FLUSHES_PREFIX}{reason}"


class SharedStats:
    """Adds to and reads the shared counters; one instance per process."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, model: str | None = None) -> None:
        """Counters of one model (None: the default model; see ``RedisKeys.model_stats``)."""
        self._redis = redis
        self._key = keys.model_stats(model)

    async def add(self, increments: Mapping[str, int]) -> None:
        """Add to the counters (one round trip)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for field, amount in increments.items():
                if amount:
                    pipe.hincrby(self._key, field, amount)
            await pipe.execute()

    async def read(self) -> dict[str, int]:
        """Every counter, zero when never incremented, then the flush reasons seen."""
        raw = await self._redis.hgetall(self._key)
        values = {as_text(k): int(v) for k, v in raw.items()}
        counters = {field: values.get(field, 0) for field in StatsField.ALL}
        counters.update(sorted((k, v) for k, v in values.items() if k.startswith(StatsField.FLUSHES_PREFIX)))
        return counters

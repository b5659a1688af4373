"""Results a client has read, kept only a while longer: memory follows the unread results.

A finished task's record is kept ``result_ttl_s`` (an hour) so a client can poll for it;
once a client has read it, ``result_ttl_after_read_s`` is enough for a retry of that read,
so its retention is shortened to that, never lengthened (``EXPIRE ... LT``), together with
its Idempotency-Key's, which must not outlive the record it names. The reads are noted as
they are answered and shortened in a pipeline every ``FLUSH_S``, off the request path; a
note lost to a crash only leaves a result its full retention.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import Field

log = logging.getLogger("brimful.store")

FLUSH_S = 0.5
MAX_NOTED = 100_000  # reads noted between two flushes; past it, a result keeps its full retention


class ReadResults:
    """Shortens the retention of the results a client has read."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self.ttl_s = ttl_s  # 0: results keep their full retention
        self._noted: set[str] = set()

    def note(self, task_id: str) -> None:
        """A client was answered this task's final state."""
        if self.ttl_s and len(self._noted) < MAX_NOTED:
            self._noted.add(task_id)

    async def run(self) -> None:
        """For the life of the process: shorten what was read, every ``FLUSH_S``."""
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                await self.flush()
            except RedisError as error:
                log.warning("read results: retention not shortened this time", extra={"error": str(error)})

    async def flush(self) -> None:
        """Shorten the records noted so far, then the Idempotency-Keys they name (another
        slot on a cluster: a second pipeline)."""
        if not self._noted:
            return
        ids, self._noted = list(self._noted), set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                key = self._keys.task(task_id)
                pipe.hget(key, Field.IDEMPOTENCY_KEY)
                pipe.expire(key, self.ttl_s, lt=True)
            replies = await pipe.execute()
        idempotency_keys = [key for key in replies[::2] if key]
        if idempotency_keys:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in idempotency_keys:
                    pipe.expire(key, self.ttl_s, lt=True)
                await pipe.execute()

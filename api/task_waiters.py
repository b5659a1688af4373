"""Requests waiting for tasks to finish, woken by a push from Redis, not by polling.

The task store publishes each task id on ``RedisKeys.finished_channel`` in the same
atomic step that stores its final state; one subscription per API process fans the
news out to every request waiting on that task.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator

from redis.asyncio import Redis

from brimful.redis_keys import RedisKeys

log = logging.getLogger("brimful.api")


class TaskWaiters:
    """Futures per task id, resolved when the task's final state is published."""

    def __init__(self, redis: Redis, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys
        self._waiting: dict[str, set[asyncio.Future[None]]] = defaultdict(set)

    @asynccontextmanager
    async def watch(self, task_id: str) -> AsyncIterator[asyncio.Future[None]]:
        """A future that resolves when ``task_id`` finishes. Register it *before* reading
        the task's state, so a result stored in between is not missed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[task_id].add(future)
        try:
            yield future
        finally:
            waiters = self._waiting.get(task_id)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._waiting[task_id]

    def _wake(self, task_id: str) -> None:
        for future in self._waiting.pop(task_id, ()):
            if not future.done():
                future.set_result(None)

    async def run(self) -> None:
        """Follow the channel for the life of the process; resubscribe after a Redis restart."""
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self._keys.finished_channel)
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        self._wake(message["data"].decode())
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("finished-task feed lost; resubscribing", extra={"error": str(error)})
                # Wake everyone: they re-read the store, so nothing waits on a lost message.
                for task_id in list(self._waiting):
                    self._wake(task_id)
                await asyncio.sleep(0.5)
            finally:
                await pubsub.aclose()

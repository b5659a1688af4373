"""Requests waiting for tasks to finish, woken by a push from Redis, not by polling.

The task store publishes each task's final record on ``RedisKeys.finished_channel`` in
the same atomic step that stores it (``FinishedMessage``); one subscription per API
process hands it to every request waiting on that task, which answers from it without
reading the task back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator

from redis.asyncio import Redis

from brimful.redis_keys import RedisKeys
from brimful.task_store import FinishedMessage, TaskRecord

log = logging.getLogger("brimful.api")


class TaskWaiters:
    """Futures per task id, resolved when the task's final state is published."""

    def __init__(self, redis: Redis, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys
        self._waiting: dict[str, set[asyncio.Future[TaskRecord | None]]] = defaultdict(set)

    @asynccontextmanager
    async def watch(self, task_id: str) -> AsyncIterator[asyncio.Future[TaskRecord | None]]:
        """A future that resolves when ``task_id`` finishes: to its final record, or to
        None when the feed was lost (then read the store). Register it *before* reading
        the task's state, or before submitting it, so a result stored in between is not
        missed."""
        future: asyncio.Future[TaskRecord | None] = asyncio.get_running_loop().create_future()
        self._waiting[task_id].add(future)
        try:
            yield future
        finally:
            waiters = self._waiting.get(task_id)
            if waiters is not None:
                waiters.discard(future)
                if not waiters:
                    del self._waiting[task_id]

    def _deliver(self, payload: bytes) -> None:
        task_id = FinishedMessage.task_id(payload)
        if task_id in self._waiting:  # most finished tasks have nobody waiting here
            self._wake(task_id, FinishedMessage.record(payload))

    def _wake(self, task_id: str, record: TaskRecord | None) -> None:
        for future in self._waiting.pop(task_id, ()):
            if not future.done():
                future.set_result(record)

    async def run(self) -> None:
        """Follow the channel for the life of the process; resubscribe after a Redis restart."""
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self._keys.finished_channel)
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        self._deliver(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("finished-task feed lost; resubscribing", extra={"error": str(error)})
                # Wake everyone: they re-read the store, so nothing waits on a lost message.
                for task_id in list(self._waiting):
                    self._wake(task_id, None)
                await asyncio.sleep(0.5)
            finally:
                await pubsub.aclose()

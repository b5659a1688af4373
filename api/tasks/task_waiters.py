"""Reading a caller's task, and waiting for it to finish: woken by a push from Redis, not
by polling.

The task store publishes each task's final record on ``RedisKeys.finished_channel`` in
the same atomic step that stores it, one message for all the tasks the step moved
(``FinishedMessage``); one subscription per API
process hands it to every request waiting on that task, which answers from it without
reading the task back.

Results a client has read are kept only a while longer (``ReadResults``): memory follows
the unread results. A finished task's record is kept ``result_ttl_s`` (an hour) so a client can poll for it;
once a client has read it, ``result_ttl_after_read_s`` is enough for a retry of that read,
so its retention is shortened to that, never lengthened (``EXPIRE ... LT``), together with
its Idempotency-Key's, which must not outlive the record it names. The reads are noted as
they are answered and shortened in a pipeline every ``FLUSH_S``, off the request path; a
note lost to a crash only leaves a result its full retention."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from types import TracebackType

from redis.exceptions import RedisError

from brimful.core import metrics
from brimful.core.redis_client import RedisClient, follow_channel
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import Field, FinishedMessage, TaskRecord
from brimful.core.task_store import TaskStore


async def read_own_task(store: TaskStore, task_id: str, tenant: str) -> TaskRecord | None:
    """The task's record if it belongs to ``tenant``; another tenant's task reads as
    unknown (404), so ids cannot be probed."""
    record = await store.get(task_id)
    return record if record is not None and record.tenant == tenant else None


class TaskWaiters:
    """Futures per task id, resolved when the task's final state is published."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, store: TaskStore, max_per_tenant: int = 0) -> None:
        self._redis = redis
        self._keys = keys
        self._store = store
        self._waiting: dict[str, set[asyncio.Future[TaskRecord | None]]] = defaultdict(set)
        self._max_per_tenant = max_per_tenant  # 0: no bound
        self._held: Counter[str] = Counter()  # requests held waiting, by tenant

    def has_room(self, tenant: str) -> bool:
        """Whether one more of ``tenant``'s requests may be held waiting in this process."""
        return not self._max_per_tenant or self._held[tenant] < self._max_per_tenant

    def _hold(self, tenant: str) -> None:
        self._held[tenant] += 1

    def _release(self, tenant: str) -> None:
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]

    def holding(self, tenant: str) -> _Held:
        """Count a request of ``tenant`` held waiting, for the ``with`` block (a caller asks
        ``has_room`` first where the limit decides whether to wait)."""
        return _Held(self, tenant)

    def watch(self, task_id: str) -> _Watch:
        """For the ``with`` block, a future that resolves when ``task_id`` finishes: to its
        final record, or to None when the feed was lost (then read the store). Register it
        *before* reading the task's state, or before submitting it, so a result stored in
        between is not missed."""
        return _Watch(self._waiting, task_id)

    async def read_held(self, task_id: str, tenant: str, wait_s: float) -> TaskRecord | None:
        """The tenant's task, held up to ``wait_s`` until it is final, counted among the
        tenant's waiters. A follow-up of the tenant's own task is held even past its limit
        of waiters: refused, its client would come back a whole second later for a result
        often milliseconds away, and each refusal costs more than the wait (on 16 cores the
        tail of an open loop followed the number refused). What bounds it is what bounds
        every request a worker serves, ``BRIMFUL_API_MAX_CONNECTIONS``, and per tenant its
        tasks in flight: a follow-up waits on a task the tenant holds. The limit still
        decides whether a submission waits (``accept_task``)."""
        with self.holding(tenant):
            return await self.read_when_final(task_id, tenant, wait_s)

    async def read_when_final(self, task_id: str, tenant: str, wait_s: float) -> TaskRecord | None:
        """The tenant's task, held up to ``wait_s`` until it is final."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.watch(task_id) as finished:
                record = await read_own_task(self._store, task_id, tenant)  # after registering: nothing slips by
                if record is None or record.status.is_final or time.monotonic() >= deadline:
                    return record
                record = await self.wait_final(task_id, tenant, finished, deadline)
                if record is None or record.status.is_final or time.monotonic() >= deadline:
                    return record

    async def wait_final(
        self, task_id: str, tenant: str, finished: asyncio.Future[TaskRecord | None], deadline: float
    ) -> TaskRecord | None:
        """Wait on a registered watch until the deadline. The push carries the final
        record, so no read is needed; on a timeout or a lost feed, the store says where
        the task is."""
        # A timer resolving the watch to None, rather than asyncio.wait_for: the same
        # outcome (read the store) for a fraction of the cost on every long-poll.
        loop = asyncio.get_running_loop()
        timer = loop.call_later(max(0.0, deadline - time.monotonic()), _resolve, finished, None)
        try:
            record = await finished
        finally:
            timer.cancel()
        if record is None:
            return await read_own_task(self._store, task_id, tenant)
        return record if record.tenant == tenant else None

    def _deliver(self, payload: bytes) -> None:
        for entry in FinishedMessage.entries(payload):
            task_id = FinishedMessage.task_id(entry)
            if task_id in self._waiting:  # most finished tasks have nobody waiting here
                self._wake(task_id, FinishedMessage.record(entry))

    def _wake(self, task_id: str, record: TaskRecord | None) -> None:
        for future in self._waiting.pop(task_id, ()):
            _resolve(future, record)

    def _wake_all(self) -> None:
        # The feed was lost: wake everyone to re-read the store, so nothing waits on a
        # message that was published while nobody listened.
        for task_id in list(self._waiting):
            self._wake(task_id, None)

    async def run(self) -> None:
        """Follow the channel for the life of the process."""
        await follow_channel(self._redis, self._keys.finished_channel, self._deliver, self._wake_all)


def _resolve(future: asyncio.Future[TaskRecord | None], record: TaskRecord | None) -> None:
    if not future.done():
        future.set_result(record)


# The two context managers below are classes, not generator functions: every long-poll
# enters both, and a class costs a fraction of contextlib's generator machinery.


class _Held:
    """One request of a tenant held waiting, for the length of a ``with`` block."""

    __slots__ = ("_tenant", "_waiters")

    def __init__(self, waiters: TaskWaiters, tenant: str) -> None:
        self._waiters, self._tenant = waiters, tenant

    def __enter__(self) -> None:
        self._waiters._hold(self._tenant)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._waiters._release(self._tenant)


class _Watch:
    """A future registered for a task's final record, for the length of a ``with`` block."""

    __slots__ = ("_future", "_task_id", "_waiting")

    def __init__(self, waiting: dict[str, set[asyncio.Future[TaskRecord | None]]], task_id: str) -> None:
        self._waiting, self._task_id = waiting, task_id
        self._future: asyncio.Future[TaskRecord | None] | None = None

    def __enter__(self) -> asyncio.Future[TaskRecord | None]:
        self._future = asyncio.get_running_loop().create_future()
        self._waiting[self._task_id].add(self._future)
        metrics.LONG_POLLS_WAITING.inc()
        return self._future

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        metrics.LONG_POLLS_WAITING.dec()
        waiters = self._waiting.get(self._task_id)
        if waiters is not None and self._future is not None:
            waiters.discard(self._future)
            if not waiters:
                del self._waiting[self._task_id]


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

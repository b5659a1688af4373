"""Task state in Redis: every move of a task between states, written by the API and the
batchers, read by clients.

Every state change goes through one Lua script that moves a task only from the states it
may leave. That is what makes redelivery harmless: a batch replayed after a crash cannot
turn a ``done`` task back into ``running`` or overwrite its outputs with a second result.
The store is also where the pieces beside the moves are reached: admission
(``core/admission.py``), Idempotency-Keys (``core/idempotency_keys.py``), the tasks whose
submission is unconfirmed (``core/admission.py``); the record's
fields are in ``core/task_record.py`` and the message a final move publishes in
``core/task_record.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import RedisError

from brimful.core.admission import Admission, Outcome, UnconfirmedTasks
from brimful.core.clock import now_ms
from brimful.core.idempotency_keys import IdempotencyKeys
from brimful.core.redis_client import RedisClient, as_text, is_cluster
from brimful.core.redis_keys import RedisKeys
from brimful.core.stats import StatsField
from brimful.core.task_record import WRITE_RECORD_LUA, Field, KnownTask, NewTask, TaskRecord, TaskStatus, Transitions

log = logging.getLogger("brimful.store")

# KEYS[1]: a task's record. ARGV: ttl_s, now_ms, the running status, submitted_at_ms,
# tenant, model. Writes the record of a task read from Kafka whose record is gone, as
# running; nothing when a record exists (it says what the task is). Returns 1 if written.
_RECREATE_LUA = (
    WRITE_RECORD_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
write_record(redis.call, KEYS[1], ARGV[1], ARGV[3], ARGV[4], ARGV[2], ARGV[5], ARGV[6], F.RECREATED, '1')
return 1
"""
)

# KEYS[1]: a task's record. ARGV: ttl_s, now_ms, the queued status, the failed status,
# submitted_at_ms, tenant, model. Puts a failed (or expired) task back to queued for a
# replay; any other task is left as it is. Returns "" when requeued, else the status kept.
_REQUEUE_LUA = (
    WRITE_RECORD_LUA
    + """
local status = redis.call('HGET', KEYS[1], F.STATUS)
if status and status ~= ARGV[4] then
  return status
end
redis.call('HDEL', KEYS[1], F.ERROR, F.OUTPUTS, F.CACHED_OUTPUTS, F.PROVENANCE)
write_record(redis.call, KEYS[1], ARGV[1], ARGV[3], ARGV[5], ARGV[2], ARGV[6], ARGV[7])
return ''
"""
)

# Why a task whose Kafka record may still be read must never run (RedisKeys.tombstone).
TOMBSTONE_CANCELLED = "cancelled"
TOMBSTONE_WITHDRAWN = "withdrawn"

# The state machine never moves a task whose record is gone; ``recreate_missing`` brings
# such a task back from its Kafka record, unless its tombstone says it must not run.
_NOT_FINAL = f"{TaskStatus.QUEUED},{TaskStatus.RUNNING}"
_QUEUED = f"{TaskStatus.QUEUED}"


@dataclass(frozen=True)
class _Lost:
    """The final move ``_move_lost`` makes again: to ``status``, writing ``field`` (and each
    task's provenance, in the order of the ids given), ``moved_counter`` gaining the count."""

    status: TaskStatus
    field: str
    moved_counter: str = ""
    provenance: Sequence[bytes] | None = None


class TaskStore:
    """Reads and writes task state; one instance per process, sharing one Redis pool."""

    def __init__(
        self,
        redis: RedisClient,
        keys: RedisKeys,
        ttl_s: int,
        waiting_ttl_s: int = 7 * 24 * 3600,
        stats_model: str | None = None,
    ) -> None:
        """``stats_model``: whose counters ``mark_done`` adds to (None: the default model's)."""
        self._redis = redis
        self._keys = keys
        self._stats_key = keys.model_stats(stats_model)
        self._ttl_s = ttl_s  # a final task's record
        # An unfinished task's record: far longer, so it never expires while it waits.
        self._waiting_ttl_s = max(ttl_s, waiting_ttl_s)
        # On a cluster every task hash has a hash slot of its own, apart from its tenant's
        # in-flight set: no script may touch both, and a batch's tasks take a script call
        # per slot (in one pipeline).
        self._cluster = is_cluster(redis)
        self._transitions = Transitions(redis, keys, self._stats_key, self._ttl_s, self._waiting_ttl_s, self._cluster)
        self._requeue = redis.register_script(_REQUEUE_LUA)
        self._admission = Admission(redis, keys, self._waiting_ttl_s, self._cluster)
        self.idempotency = IdempotencyKeys(redis, keys, self._waiting_ttl_s)
        self.unconfirmed = UnconfirmedTasks(redis, keys)

    @property
    def keys(self) -> RedisKeys:
        """The key layout this store writes under."""
        return self._keys

    async def create_queued(
        self, task_id: str, submitted_at_ms: int, tenant: str = "", max_in_flight: int = 0, model: str = ""
    ) -> int | None:
        """Record a newly accepted task as queued and count it in its tenant's tasks in
        flight (one round trip). Written before the request reaches Kafka, so a fast
        batcher can never find the task missing or have its result overwritten. When the
        tenant already has ``max_in_flight`` unfinished tasks (0: no limit), the record is
        taken back and that count is returned; None when recorded. The count and the check
        are one atomic step, so concurrent submissions are never over-admitted."""
        (outcome,) = await self.create_queued_many([NewTask(task_id, submitted_at_ms, tenant, max_in_flight, model)])
        if isinstance(outcome, RedisError):
            raise outcome
        return outcome

    async def create_queued_many(self, tasks: Sequence[NewTask]) -> list[Outcome]:
        """``create_queued`` for a group of tasks in one round trip. Each is answered on its
        own, in order: None when recorded, its tenant's count when refused, or the
        RedisError of a command of its own that failed (say a key of its tenant's holding
        the wrong type); nothing of a refused or failed task stays. When the round trip
        itself fails (connection, timeout), nothing of the group is left behind (as far as
        Redis lets it be removed) and the error is raised."""
        if not tasks:
            return []
        try:
            return await self._admission.admit(tasks)
        except RedisError:
            await self._forget_quietly([(task.task_id, task.tenant) for task in tasks])
            raise

    async def requeue(self, task_id: str, submitted_at_ms: int, tenant: str = "", model: str = "") -> str | None:
        """Put a failed task back to ``queued`` for a replay (recreating it if it expired),
        in one atomic step that touches nothing else: a task done, cancelled, or already
        queued or running again (a second dead letter of it replayed) keeps its state and
        its result. Returns None when requeued, else the status it keeps. Written before the
        request is sent again, as for a new task; it counts as in flight for its tenant
        again (an operator's replay is never refused for it)."""
        kept = await self._requeue(
            keys=[self._keys.task(task_id)],
            args=[
                self._waiting_ttl_s,
                now_ms(),
                TaskStatus.QUEUED.value,
                TaskStatus.FAILED.value,
                submitted_at_ms,
                tenant,
                model,
            ],
        )
        if kept:
            return str(kept.decode() if isinstance(kept, bytes) else kept)
        await self._redis.zadd(self._keys.in_flight(tenant), {task_id: now_ms()})
        return None

    async def forget(self, task_id: str, tenant: str = "") -> None:
        """Remove a task that was never accepted (its enqueue failed), and its slot in flight."""
        await self.forget_many([(task_id, tenant)])

    async def withdraw_many(self, tasks: Sequence[tuple[str, str]]) -> None:
        """``forget`` (task id, tenant) pairs whose Kafka record may exist all the same (a
        send the broker answered with an error may have landed): each gets its tombstone
        first, so a batcher that reads the record never brings the task back."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id, _ in tasks:
                pipe.set(self._keys.tombstone(task_id), TOMBSTONE_WITHDRAWN, ex=self._waiting_ttl_s)
            await pipe.execute()
        await self.forget_many(tasks)

    async def forget_many(self, tasks: Sequence[tuple[str, str]]) -> None:
        """``forget`` for (task id, tenant) pairs, in one round trip."""
        await self._admission.take_back(tasks)

    async def _forget_quietly(self, tasks: Sequence[tuple[str, str]]) -> None:
        # After a failed create: whatever half of it landed goes; if Redis is down, the
        # records expire and the in-flight entries age out with the waiting TTL.
        try:
            await self.forget_many(tasks)
        except RedisError:
            pass

    async def get(self, task_id: str) -> TaskRecord | None:
        """The stored task, or None when unknown or expired."""
        raw = await self._redis.hgetall(self._keys.task(task_id))
        if not raw:
            return None
        return TaskRecord.from_fields(task_id, {as_text(k): as_text(v) for k, v in raw.items()})

    async def get_many(self, task_ids: Sequence[str]) -> list[TaskRecord | None]:
        """The stored tasks, in order (None for one unknown or expired), in one round trip."""
        if not task_ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hgetall(self._keys.task(task_id))
            raws = await pipe.execute()
        return [
            TaskRecord.from_fields(task_id, {as_text(k): as_text(v) for k, v in raw.items()}) if raw else None
            for task_id, raw in zip(task_ids, raws)
        ]

    async def unfinished(self, task_ids: Iterable[str]) -> list[str]:
        """Those of these tasks that have not reached a final state (in one round trip)."""
        ids = list(task_ids)
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hget(self._keys.task(task_id), "status")
            statuses = await pipe.execute()
        return [
            task_id
            for task_id, status in zip(ids, statuses)
            if status is None or not TaskStatus(status.decode()).is_final
        ]

    async def leave_in_flight_if_final(self, tasks: Sequence[tuple[str, str]]) -> int:
        """On a Redis Cluster, take those of (task id, tenant) whose record is final out of
        their tenants' in-flight sets; how many were final. There a final move leaves the
        in-flight set in a second round trip (the set is in another slot), and a batcher
        that stopped or failed between the two leaves the entry: the task's redelivery,
        found final, mends it here. On one Redis the move did it in the same step."""
        if not self._cluster or not tasks:
            return 0
        unfinished = set(await self.unfinished(task_id for task_id, _ in tasks))
        final = [(task_id, tenant) for task_id, tenant in tasks if task_id not in unfinished]
        if final:
            async with self._redis.pipeline(transaction=False) as pipe:
                for task_id, tenant in final:
                    pipe.zrem(self._keys.in_flight(tenant), task_id)
                await pipe.execute()
        return len(final)

    async def mark_running(self, task_ids: Iterable[str]) -> list[str]:
        """Move tasks to running; returns those that moved. Final ones (a task cancelled a
        moment ago among them) stay as they are and must not be sent to the model: this
        atomic move is what decides between a cancel and a dispatch."""
        ids = list(task_ids)
        return await self._transitions.move(ids, TaskStatus.RUNNING, _NOT_FINAL, "", ["" for _ in ids])

    async def recreate_missing(self, tasks: Sequence[KnownTask]) -> list[str]:
        """Write the record of each task whose record is gone (Redis lost it: a restart, a
        failover, a lost second of AOF), as running, from what its Kafka record says;
        returns the ids written. The Kafka record is the source of truth: a task without a
        record is computed, unless its tombstone says it was cancelled or withdrawn. A task
        whose record exists is left as it is. Two round trips, only on this rare path."""
        if not tasks:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in tasks:
                pipe.exists(self._keys.task(task.task_id))
                pipe.exists(self._keys.tombstone(task.task_id))
            found = await pipe.execute()
        missing = [task for index, task in enumerate(tasks) if not found[2 * index] and not found[2 * index + 1]]
        if not missing:
            return []
        now = now_ms()
        async with self._redis.pipeline(transaction=False) as pipe:
            for task in missing:
                # As text: a registered script in a pipeline costs a round trip more.
                pipe.eval(
                    _RECREATE_LUA,
                    1,
                    self._keys.task(task.task_id),
                    self._waiting_ttl_s,
                    now,
                    TaskStatus.RUNNING.value,
                    task.submitted_at_ms,
                    task.tenant,
                    task.model,
                )
            written = await pipe.execute()
        return [task.task_id for task, wrote in zip(missing, written) if int(wrote)]

    async def mark_done(
        self,
        outputs_by_task: Mapping[str, Mapping[str, Any] | bytes],
        counters: Mapping[str, int] | None = None,
        done_counter: str = "",
        cached: bool = False,
        known: Mapping[str, KnownTask] | None = None,
        provenance: Mapping[str, bytes] | None = None,
    ) -> int:
        """Store outputs and move tasks to done, unless they already reached a final state.
        ``counters`` are added to the shared counters (``RedisKeys.model_stats``) and
        ``done_counter`` gains the number of tasks moved, in the same round trip on one
        Redis (in the move itself), so a batch's result costs one. ``cached``: the outputs
        were computed for an identical task (stored as ``cached_outputs``, so every answer
        can say so). An output given as bytes is its JSON already. ``known``: what the
        tasks' Kafka records say, by id; a task among them whose record Redis lost while it
        ran is written again and then moved (``_move_lost``), never dropped. ``provenance``:
        each task's (``core/task_provenance.py``), by id, written in the same step."""
        ids = list(outputs_by_task)
        # orjson: a twenty-fifth of json.dumps's cost for a row's outputs (0.3 against 7.5 us).
        values = [v if isinstance(v := outputs_by_task[t], bytes) else orjson.dumps(v) for t in ids]
        origins = [provenance[t] for t in ids] if provenance else None
        field = Field.CACHED_OUTPUTS if cached else Field.OUTPUTS
        moved = await self._transitions.move(
            ids, TaskStatus.DONE, _NOT_FINAL, field, values, publish=True, counters=counters or {},
            moved_counter=done_counter, provenance=origins,
        )  # fmt: skip
        if known and len(moved) < len(ids):
            lost = _Lost(TaskStatus.DONE, field, done_counter, origins)
            moved += await self._move_lost(ids, values, moved, known, lost)
        return len(moved)

    async def mark_failed(
        self, task_ids: Iterable[str], error: Mapping[str, Any], known: Mapping[str, KnownTask] | None = None
    ) -> int:
        """Record the error and move tasks to failed, unless they already reached a final
        state; ``known`` as for ``mark_done``."""
        ids = list(task_ids)
        values = [orjson.dumps(error) for _ in ids]
        moved = await self._transitions.move(ids, TaskStatus.FAILED, _NOT_FINAL, Field.ERROR, values, publish=True)
        if known and len(moved) < len(ids):
            moved += await self._move_lost(ids, values, moved, known, _Lost(TaskStatus.FAILED, Field.ERROR))
        return len(moved)

    async def _move_lost(
        self, ids: list[str], values: list[bytes], moved: list[str], known: Mapping[str, KnownTask], lost: _Lost
    ) -> list[str]:
        """The final move again for the tasks it left whose record was gone (Redis lost it
        while their batch was at the model): each is written again from its Kafka record,
        as dispatch does (``recreate_missing``), then moved. Tasks final already, cancelled
        or withdrawn stay as they are. Only on this rare path: two round trips more."""
        taken = set(moved)
        left = [index for index, task_id in enumerate(ids) if task_id not in taken and task_id in known]
        recreated = set(await self.recreate_missing([known[ids[index]] for index in left]))
        again = [index for index in left if ids[index] in recreated]
        if not again:
            return []
        log.warning("task records lost while their batch ran: written again, then stored", extra={"tasks": len(again)})
        origins = lost.provenance
        return await self._transitions.move(
            [ids[index] for index in again], lost.status, _NOT_FINAL, lost.field, [values[index] for index in again],
            publish=True, moved_counter=lost.moved_counter,
            provenance=[origins[index] for index in again] if origins else None,
        )  # fmt: skip

    async def mark_expired(self, reasons: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Move still-queued tasks to expired, each with its reason (by task id), counting
        them in the shared counters in the same step; returns those that moved (a task
        already running or final stays as it is)."""
        ids = list(reasons)
        return await self._transitions.move(
            ids,
            TaskStatus.EXPIRED,
            _QUEUED,
            Field.ERROR,
            [orjson.dumps(reasons[task_id]) for task_id in ids],
            publish=True,
            counters={},
            moved_counter=StatsField.TASKS_EXPIRED,
        )

    async def cancel(self, task_id: str, model: str | None = None) -> bool:
        """Cancel a task that is still queued; False if it already left the queue. Its
        model's batchers (``model``: its scope, None for the default model) hear of it."""
        moved = await self._transitions.move([task_id], TaskStatus.CANCELLED, _QUEUED, "", [""], publish=True)
        if moved:
            # The tombstone outlives the record, so a redelivered record never runs it.
            await self._redis.set(self._keys.tombstone(task_id), TOMBSTONE_CANCELLED, ex=self._waiting_ttl_s)
            await self._redis.publish(self._keys.model_cancelled_channel(model), task_id)
        return bool(moved)

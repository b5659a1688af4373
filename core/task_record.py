"""A task's record in Redis (``RedisKeys.task``): its status, its fields, the one Lua
function that writes a new record, the one that moves it between statuses, the record as
``GET /v1/tasks/{id}`` shows it, and the message that carries final records to the
waiting requests.

Three paths write a record from nothing: admission (a new task), the re-creation of a
task whose record Redis lost, and a replay. They all go through ``WRITE_RECORD_LUA``
(on a Redis Cluster admission writes the same fields through ``record_fields``).

The task store publishes a message on ``RedisKeys.finished_channel`` when tasks reach a
final state (``FINISHED_MESSAGE_LUA`` writes it, ``FinishedMessage`` reads it; the
integration tests of the task store run both). One message holds every task one step
moved (a batch's, say), each entry the whole final record, so a long-poll can answer
without reading the task back. Entries are separated by the ASCII record separator
(0x1E); each has nine newline-separated fields: task id, status, submitted_at_ms,
updated_at_ms, tenant, model, the task's provenance (JSON, or empty), then the name of the
stored field ("outputs", "cached_outputs", "error" or empty) and its JSON value. Task ids,
model names and tenants hold neither character, and JSON text holds no raw control
character. A message from a batcher of an earlier release lacks the provenance field, and
one from before tasks named their model the model field too.

``Transitions`` is the one way a task changes state: a Lua script that moves tasks only from the states
they may leave, in one step with what goes with the move (the stored field, the tenant's
in-flight entry, the Idempotency-Key's lifetime, the shared counters, the finished-tasks
message). On a Redis Cluster a batch's tasks take a script call per hash slot (in one
pipeline), and what lives in other slots follows right after."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import orjson
from redis.crc import key_slot

from brimful.core.clock import now_ms
from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_provenance import provenance_answer


class TaskStatus(StrEnum):
    """Where a task stands. ``done``, ``failed`` and ``cancelled`` are final."""

    QUEUED = "queued"  # accepted and on the requests topic
    RUNNING = "running"  # in a batch at the model
    DONE = "done"  # outputs stored
    FAILED = "failed"  # retries exhausted; the request is on the DLQ
    CANCELLED = "cancelled"  # cancelled before it reached the model
    EXPIRED = "expired"  # its deadline passed before it was sent to the model: never computed

    @property
    def is_final(self) -> bool:
        return self in (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED)


class Field:
    """The fields of a task's hash."""

    STATUS = "status"
    SUBMITTED_AT_MS = "submitted_at_ms"
    UPDATED_AT_MS = "updated_at_ms"
    TENANT = "tenant"
    MODEL = "model"
    IDEMPOTENCY_KEY = "idem"  # the Redis key of the Idempotency-Key it was submitted with
    RECREATED = "recreated"  # "1": written again from its Kafka record
    # What a final task holds, one of: its own outputs, an identical task's (the result
    # cache: the same JSON, and the answer says cached), or its error.
    OUTPUTS = "outputs"
    CACHED_OUTPUTS = "cached_outputs"
    ERROR = "error"
    # A done task's batch and where its time went (``core/task_provenance.py``), written
    # with its outputs.
    PROVENANCE = "provenance"


def _fields_lua() -> str:
    pairs = ", ".join(f"{name} = '{value}'" for name, value in vars(Field).items() if name.isupper())
    return f"local F = {{{pairs}}}\n"


# The field names for Lua, as ``F.STATUS`` and so on: every script that touches a record
# starts with this.
FIELDS_LUA = _fields_lua()

# write_record(call, key, ttl_s, status, submitted_at_ms, updated_at_ms, tenant, model,
# extra...): the record from nothing (extra: more field, value pairs), kept ttl_s; returns
# the HSET's reply. ``call`` is redis.call, or redis.pcall for a caller that must survive a
# key of the wrong type (the error reply is returned and nothing expires).
WRITE_RECORD_LUA = (
    FIELDS_LUA
    + """
local function write_record(call, key, ttl, status, submitted, updated, tenant, model, ...)
  local reply = call('HSET', key, F.STATUS, status, F.SUBMITTED_AT_MS, submitted, F.UPDATED_AT_MS, updated,
                     F.TENANT, tenant, F.MODEL, model, ...)
  if type(reply) == 'table' and reply.err then
    return reply
  end
  redis.call('EXPIRE', key, ttl)
  return reply
end
"""
)


def record_fields(status: TaskStatus, submitted_at_ms: int, tenant: str, model: str) -> dict[str, str | int]:
    """A new record's fields as ``WRITE_RECORD_LUA`` writes them, for a writer in Python."""
    return {
        Field.STATUS: status.value,
        Field.SUBMITTED_AT_MS: submitted_at_ms,
        Field.UPDATED_AT_MS: submitted_at_ms,
        Field.TENANT: tenant,
        Field.MODEL: model,
    }


class KnownTask(NamedTuple):
    """What a task's Kafka record says of it: enough to write its record again."""

    task_id: str
    submitted_at_ms: int
    tenant: str
    model: str


class NewTask(NamedTuple):
    """A task to record as queued: its id, when it was submitted, its tenant, the
    tenant's limit of tasks in flight (0: none), the model it is for, and the
    Idempotency-Key it was submitted with ("": none; its lifetime then follows the task's)."""

    task_id: str
    submitted_at_ms: int
    tenant: str = ""
    max_in_flight: int = 0
    model: str = ""
    idempotency_key: str = ""


@dataclass(frozen=True)
class TaskRecord:
    """A task as stored: what ``GET /v1/tasks/{id}`` shows."""

    task_id: str
    status: TaskStatus
    submitted_at_ms: int
    updated_at_ms: int
    outputs: dict[str, Any] | None
    error: dict[str, Any] | None
    tenant: str = ""
    model: str = ""  # empty for a task recorded before tasks named their model
    cached: bool = False  # done with a result computed for an identical task, not its own call
    provenance: dict[str, Any] | None = None  # as stored (``core/task_provenance.py``); None: not written

    @classmethod
    def from_fields(cls, task_id: str, fields: dict[str, str]) -> TaskRecord:
        """The record from its hash's fields, as text."""
        outputs = fields.get(Field.OUTPUTS, fields.get(Field.CACHED_OUTPUTS))
        return cls(
            task_id=task_id,
            status=TaskStatus(fields[Field.STATUS]),
            submitted_at_ms=int(fields.get(Field.SUBMITTED_AT_MS, 0)),
            updated_at_ms=int(fields.get(Field.UPDATED_AT_MS, 0)),
            outputs=orjson.loads(outputs) if outputs else None,
            error=orjson.loads(fields[Field.ERROR]) if Field.ERROR in fields else None,
            tenant=fields.get(Field.TENANT, ""),
            model=fields.get(Field.MODEL, ""),
            cached=Field.CACHED_OUTPUTS in fields,
            provenance=orjson.loads(fields[Field.PROVENANCE]) if fields.get(Field.PROVENANCE) else None,
        )


def task_record_answer(task_id: str, record: TaskRecord, default_model: str) -> dict[str, Any]:
    """A task as the API shows it (and its webhook events carry it). A record written
    before tasks named their model (``model`` empty) was for the default model: the only
    one served then."""
    answer: dict[str, Any] = {
        "task_id": task_id,
        "model": record.model or default_model,
        "status": record.status.value,
        "submitted_at_ms": record.submitted_at_ms,
        "updated_at_ms": record.updated_at_ms,
    }
    if record.status is TaskStatus.DONE:
        answer["outputs"] = record.outputs
        answer["cached"] = record.cached  # true: an identical task's result, no model call of its own
        if record.provenance is not None:
            answer["provenance"] = task_provenance(record)
    if record.status in (TaskStatus.FAILED, TaskStatus.EXPIRED):
        answer["error"] = record.error
    return answer


def task_provenance(record: TaskRecord) -> dict[str, Any]:
    """A done task's provenance as the API shows it ({} where none was stored: provenance
    was off, or the task finished before it was written)."""
    if record.provenance is None:
        return {}
    return provenance_answer(record.provenance, record.submitted_at_ms, record.updated_at_ms)


# finished_entry(...) is one entry; publish_finished(channel, entries) sends them as one message.
FINISHED_MESSAGE_LUA = """
local function finished_entry(task_id, status, submitted, updated, tenant, model, provenance, field, value)
  return table.concat({task_id, status, submitted, updated, tenant, model, provenance, field, value}, '\\n')
end
local function publish_finished(channel, entries)
  if #entries > 0 then
    redis.call('PUBLISH', channel, table.concat(entries, '\\030'))
  end
end
"""


class FinishedMessage:
    """Reads a finished-tasks message (see the module's docstring)."""

    SEPARATOR = b"\x1e"

    @staticmethod
    def entries(payload: bytes) -> list[bytes]:
        """One entry per task (a message from before batching is one entry)."""
        return payload.split(FinishedMessage.SEPARATOR)

    @staticmethod
    def task_id(entry: bytes) -> str:
        """Just the id: cheap, for the many entries nobody waits on."""
        return entry.split(b"\n", 1)[0].decode()

    @staticmethod
    def record(entry: bytes) -> TaskRecord:
        parts = entry.decode().split("\n", 8)
        # An earlier release's entry: its JSON value holds no newline, so the count is unambiguous.
        if len(parts) == 7:  # no model field, no provenance
            parts[5:5] = ["", ""]
        elif len(parts) == 8:  # no provenance
            parts.insert(6, "")
        task_id, status, submitted, updated, tenant, model, provenance, field, value = parts
        decoded = orjson.loads(value) if field and value else None
        return TaskRecord(
            task_id=task_id,
            status=TaskStatus(status),
            submitted_at_ms=int(submitted),
            updated_at_ms=int(updated),
            outputs=decoded if field in (Field.OUTPUTS, Field.CACHED_OUTPUTS) else None,
            error=decoded if field == Field.ERROR else None,
            tenant=tenant,
            model=model,
            cached=field == Field.CACHED_OUTPUTS,
            provenance=orjson.loads(provenance) if provenance else None,
        )


# --- from core/task_record.py ---
# The one way a task changes state: a Lua script that moves tasks only from the states
# KEYS: task hashes (on a Redis Cluster, all in one hash slot), then, when ARGV[8] is "1",
# the shared counters' hash. ARGV: ttl_s (kept from now on), now_ms, new status,
# allowed-from statuses (comma-separated; a missing hash never moves), field name, channel
# to publish the moved tasks on, all in one message ("" for none), the prefix of the
# tenants' in-flight sets to remove a moved task from ("" to leave them: the new status is
# not final, or the sets live in other hash slots), "1" if the counters' hash is the last
# key, the counter that gains the number of tasks moved ("" for none), the number n of
# (counter, amount) pairs to add, "1" if each task's provenance follows its field value,
# those 2n values, then one field value per task ("" writes no field), then, with
# provenance, one provenance per task (written with the field). Returns the 1-based position of each task that moved, followed by its
# tenant and the Redis key of its Idempotency-Key ("" for none). When the task becomes
# final and its in-flight set is left here (one Redis), that key is kept only ttl_s from
# now, as the task's result is (on a cluster the store does it after).
_TRANSITION_LUA = (
    FIELDS_LUA
    + FINISHED_MESSAGE_LUA
    + """
local ttl, now, new_status, allowed, field, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local in_flight_prefix = ARGV[7]
local counted = ARGV[8] == '1'
local moved_counter, pairs = ARGV[9], tonumber(ARGV[10])
local with_provenance = ARGV[11] == '1'
local tasks = #KEYS
if counted then
  tasks = tasks - 1
end
local first_value = 11 + 2 * pairs
local moved = {}
local finished = {}
for i = 1, tasks do
  local key = KEYS[i]
  -- One read and one write a task: what it is now, and what it becomes.
  local kept = redis.call('HMGET', key, F.STATUS, F.TENANT, F.SUBMITTED_AT_MS, F.MODEL, F.IDEMPOTENCY_KEY)
  local current = kept[1]
  if current and string.find(',' .. allowed .. ',', ',' .. current .. ',', 1, true) then
    local value = ARGV[first_value + i]
    local provenance = ''
    if with_provenance then
      provenance = ARGV[first_value + tasks + i]
    end
    if provenance ~= '' and field ~= '' and value ~= '' then
      redis.call('HSET', key, F.STATUS, new_status, F.UPDATED_AT_MS, now, field, value, F.PROVENANCE, provenance)
    elseif field ~= '' and value ~= '' then
      redis.call('HSET', key, F.STATUS, new_status, F.UPDATED_AT_MS, now, field, value)
    else
      redis.call('HSET', key, F.STATUS, new_status, F.UPDATED_AT_MS, now)
    end
    redis.call('EXPIRE', key, ttl)
    local task_id = string.match(key, '[^:]+$')
    local tenant, submitted, model = kept[2] or '', kept[3] or '0', kept[4] or ''
    local idem = kept[5] or ''
    if in_flight_prefix ~= '' then
      redis.call('ZREM', in_flight_prefix .. tenant, task_id)
      if idem ~= '' then
        redis.call('EXPIRE', idem, ttl)
      end
    end
    if channel ~= '' then
      finished[#finished + 1] = finished_entry(task_id, new_status, submitted, now, tenant, model, provenance, field, value)
    end
    moved[#moved + 1] = i
    moved[#moved + 1] = tenant
    moved[#moved + 1] = idem
  end
end
publish_finished(channel, finished)
if counted then
  for p = 0, pairs - 1 do
    redis.call('HINCRBY', KEYS[#KEYS], ARGV[12 + 2 * p], ARGV[13 + 2 * p])
  end
  if moved_counter ~= '' and #moved > 0 then
    redis.call('HINCRBY', KEYS[#KEYS], moved_counter, #moved / 3)
  end
end
return moved
"""
)


class Transitions:
    """Moves tasks between states (see the module's docstring)."""

    def __init__(
        self, redis: RedisClient, keys: RedisKeys, stats_key: str, ttl_s: int, waiting_ttl_s: int, cluster: bool
    ) -> None:
        """``ttl_s``: how long a final task's record is kept; ``waiting_ttl_s``: an
        unfinished one's; ``stats_key``: the shared counters' hash."""
        self._redis = redis
        self._keys = keys
        self._stats_key = stats_key
        self._ttl_s = ttl_s
        self._waiting_ttl_s = waiting_ttl_s
        self._cluster = cluster
        self._transition = redis.register_script(_TRANSITION_LUA)

    async def move(
        self,
        task_ids: list[str],
        status: TaskStatus,
        allowed_from: str,
        field: str,
        values: Sequence[str | bytes],
        publish: bool = False,
        counters: Mapping[str, int] | None = None,
        moved_counter: str = "",
        provenance: Sequence[bytes] | None = None,
    ) -> list[str]:
        """Move those of ``task_ids`` whose status is in ``allowed_from`` (comma-separated)
        to ``status``, writing ``field`` with each one's value (""; none); returns the ids
        moved. ``publish``: send the finished-tasks message; ``counters`` are added to the
        shared counters and ``moved_counter`` gains the number moved; ``provenance``: each
        task's, written with its field."""
        counters = {name: amount for name, amount in (counters or {}).items() if amount}
        if not task_ids:
            return []
        keys = [self._keys.task(t) for t in task_ids]
        channel = self._keys.finished_channel if publish else ""
        # On one Redis the script leaves the tenants' in-flight sets in the same step; on a
        # cluster they live in other slots, and are left right after (see below).
        in_flight_prefix = self._keys.in_flight_prefix if status.is_final and not self._cluster else ""
        ttl = self._ttl_s if status.is_final else self._waiting_ttl_s
        args = [ttl, now_ms(), status.value, allowed_from, field, channel, in_flight_prefix]
        # On one Redis the counters are added by the move itself; on a cluster their hash
        # lives in another slot, and they are added right after (see below).
        counted = bool(counters or moved_counter) and not self._cluster
        if counted:
            pairs = [part for name, amount in counters.items() for part in (name, amount)]
            args += ["1", moved_counter, len(counters), "1" if provenance else "0", *pairs]
            keys_with_stats = [*keys, self._stats_key]
        else:
            args += ["0", "", 0, "1" if provenance else "0"]
            keys_with_stats = keys
        groups = _by_slot(keys) if self._cluster else [list(range(len(keys)))]
        extra = provenance or ()
        if len(groups) == 1:
            replies = [await self._transition(keys=keys_with_stats, args=[*args, *values, *extra])]
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                for group in groups:
                    group_values = [values[i] for i in group] + ([extra[i] for i in group] if extra else [])
                    pipe.eval(_TRANSITION_LUA, len(group), *(keys[i] for i in group), *args, *group_values)
                replies = await pipe.execute()
        moved: list[tuple[str, str, bytes]] = []  # (task id, tenant, its Idempotency-Key's Redis key)
        for group, reply in zip(groups, replies):
            for position, tenant, idem in zip(reply[::3], reply[1::3], reply[2::3]):
                moved.append((task_ids[group[int(position) - 1]], tenant.decode(), idem))
        if self._cluster and ((status.is_final and moved) or counters or (moved_counter and moved)):
            await self._after_move_on_cluster(moved, status, ttl, counters, moved_counter)
        return [task_id for task_id, _, _ in moved]

    async def _after_move_on_cluster(
        self,
        moved: list[tuple[str, str, bytes]],
        status: TaskStatus,
        ttl: int,
        counters: Mapping[str, int],
        moved_counter: str,
    ) -> None:
        """On a cluster, what the script could not do in its own slot: the tenants' in-flight
        sets left and Idempotency-Keys' lives set for final moves, the counters added. A
        crash before this leaves an in-flight entry until the task, read again and found
        final, takes it out (TaskStore.leave_in_flight_if_final); the counters stay short."""
        async with self._redis.pipeline(transaction=False) as pipe:
            if status.is_final:
                for task_id, tenant, idem in moved:
                    pipe.zrem(self._keys.in_flight(tenant), task_id)
                    if idem:
                        pipe.expire(idem, ttl)
            for name, amount in counters.items():
                pipe.hincrby(self._stats_key, name, amount)
            if moved_counter and moved:
                pipe.hincrby(self._stats_key, moved_counter, len(moved))
            await pipe.execute()


def _by_slot(keys: list[str]) -> list[list[int]]:
    """The positions of ``keys`` grouped by hash slot, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode()), []).append(position)
    return list(groups.values())

"""A task's record in Redis (``RedisKeys.task``): its status, its fields, the one Lua
function that writes a new record, the record as ``GET /v1/tasks/{id}`` shows it, and the
message that carries final records to the waiting requests.

Three paths write a record from nothing: admission (a new task), the re-creation of a
task whose record Redis lost, and a replay. They all go through ``WRITE_RECORD_LUA``
(on a Redis Cluster admission writes the same fields through ``record_fields``).

The task store publishes a message on ``RedisKeys.finished_channel`` when tasks reach a
final state (``FINISHED_MESSAGE_LUA`` writes it, ``FinishedMessage`` reads it; the
integration tests of the task store run both). One message holds every task one step
moved (a batch's, say), each entry the whole final record, so a long-poll can answer
without reading the task back. Entries are separated by the ASCII record separator
(0x1E); each has eight newline-separated fields: task id, status, submitted_at_ms,
updated_at_ms, tenant, model, then the name of the stored field ("outputs",
"cached_outputs", "error" or empty) and its JSON value. Task ids, model names and tenants
hold neither character, and JSON text holds no raw control character. A message from a
batcher of the release before tasks named their model has no model field."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import orjson


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
    if record.status in (TaskStatus.FAILED, TaskStatus.EXPIRED):
        answer["error"] = record.error
    return answer


# finished_entry(...) is one entry; publish_finished(channel, entries) sends them as one message.
FINISHED_MESSAGE_LUA = """
local function finished_entry(task_id, status, submitted, updated, tenant, model, field, value)
  return table.concat({task_id, status, submitted, updated, tenant, model, field, value}, '\\n')
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
        parts = entry.decode().split("\n", 7)
        if len(parts) == 7:  # no model field: its JSON value holds no newline, so 7 is unambiguous
            parts.insert(5, "")
        task_id, status, submitted, updated, tenant, model, field, value = parts
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
        )

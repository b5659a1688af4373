"""The message the task store publishes on ``RedisKeys.finished_channel`` when tasks reach
a final state, and how a waiting request reads it: the Lua that writes an entry and the
Python that reads it, side by side (tests/integration/test_task_store.py runs both).

One message holds every task one step moved (a batch's, say), each entry the whole final
record, so a long-poll can answer without reading the task back. Entries are separated by
the ASCII record separator (0x1E); each has eight newline-separated fields: task id,
status, submitted_at_ms, updated_at_ms, tenant, model, then the name of the stored field
("outputs", "cached_outputs", "error" or empty) and its JSON value. Task ids, model names
and tenants hold neither character, and JSON text holds no raw control character. A
message from a batcher of the release before tasks named their model has no model field."""

from __future__ import annotations

import orjson

from brimful.core.task_record import Field, TaskRecord
from brimful.core.task_status import TaskStatus

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

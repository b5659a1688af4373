"""Batch jobs in Redis: each job's record (OpenAI's Batch object, plus where its driver
stands), its lines running now, the jobs still to drive, and the lease that lets one API
worker drive a job at a time.

Every status change goes through one Lua script that moves a job only from the states it
may leave (``core/batch_status.py``), so a cancel and the driver's own moves never undo each
other. A final job's record is kept ``FINAL_TTL_S``; its files stay until deleted.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from brimful.core.batch_status import MOVES, TIMESTAMP_FIELDS, BatchStatus
from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

BATCH_ID_PREFIX = "batch_"
FINAL_TTL_S = 30 * 24 * 3600
MAX_LISTED = 10_000  # the most index entries one page reads
# What a job does with an invalid input line: fail at validating (OpenAI's way, the
# default), or run the valid lines and answer each invalid one in the error file.
INVALID_LINES = ("fail", "error_file")

# KEYS[1]: the job's record. ARGV: the states it may leave (comma-separated), the new one,
# its timestamp field and value, then (field, value) pairs to set with it. Returns the
# state it left, or false when it was in none of them (or is gone).
_MOVE_LUA = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current or not string.find(',' .. ARGV[1] .. ',', ',' .. current .. ',', 1, true) then
  return false
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], ARGV[3], ARGV[4])
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return current
"""


def new_batch_id() -> str:
    return f"{BATCH_ID_PREFIX}{secrets.token_hex(12)}"


def is_batch_id(text: str) -> bool:
    rest = text[len(BATCH_ID_PREFIX) :]
    return text.startswith(BATCH_ID_PREFIX) and len(rest) == 24 and all(c in "0123456789abcdef" for c in rest)


@dataclass
class BatchRecord:
    """A job as stored."""

    batch_id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    times: dict[str, int] = field(default_factory=dict)  # the state timestamps reached
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    # Where the driver stands: lines of the input read and run (or refused), the parts of
    # the output and error files written so far, and why it ends early ("" while it runs).
    lines_done: int = 0
    output_parts: int = 0
    error_parts: int = 0
    ending: str = ""
    output_expires_s: int | None = None  # ``output_expires_after``: its result files' life
    model: str = ""  # the model its lines run on (of the first line run)
    input_tokens: int = 0  # what its completed lines counted in usage
    invalid_lines: str = INVALID_LINES[0]
    retry_of: str = ""  # the job whose failed lines this one runs again

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's Batch object."""
        times = {name: self.times.get(name) for name in TIMESTAMP_FIELDS}
        times["created_at"] = self.created_at
        return {
            "id": self.batch_id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            **times,
            "expires_at": self.expires_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
            "model": self.model or None,
            "retry_of": self.retry_of or None,
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens,
            },
        }

    def fields(self) -> dict[str, str]:
        values: dict[str, Any] = {
            "tenant": self.tenant,
            "endpoint": self.endpoint,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "metadata": orjson.dumps(self.metadata).decode(),
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "output_file_id": self.output_file_id or "",
            "error_file_id": self.error_file_id or "",
            "errors": orjson.dumps(self.errors).decode(),
            "lines_done": self.lines_done,
            "output_parts": self.output_parts,
            "error_parts": self.error_parts,
            "ending": self.ending,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "invalid_lines": self.invalid_lines,
            "retry_of": self.retry_of,
            **({"output_expires_s": self.output_expires_s} if self.output_expires_s is not None else {}),
            **self.times,
        }
        return {name: str(value) for name, value in values.items()}

    @classmethod
    def from_fields(cls, batch_id: str, raw: Mapping[str, str]) -> BatchRecord:
        return cls(
            batch_id=batch_id,
            tenant=raw["tenant"],
            endpoint=raw["endpoint"],
            input_file_id=raw["input_file_id"],
            completion_window=raw["completion_window"],
            status=BatchStatus(raw["status"]),
            created_at=int(raw["created_at"]),
            expires_at=int(raw["expires_at"]),
            metadata=orjson.loads(raw.get("metadata", "null")),
            times={name: int(raw[name]) for name in TIMESTAMP_FIELDS if name in raw and name != "created_at"},
            total=int(raw.get("total", 0)),
            completed=int(raw.get("completed", 0)),
            failed=int(raw.get("failed", 0)),
            output_file_id=raw.get("output_file_id") or None,
            error_file_id=raw.get("error_file_id") or None,
            errors=orjson.loads(raw.get("errors", "[]")),
            lines_done=int(raw.get("lines_done", 0)),
            output_parts=int(raw.get("output_parts", 0)),
            error_parts=int(raw.get("error_parts", 0)),
            ending=raw.get("ending", ""),
            output_expires_s=int(raw["output_expires_s"]) if "output_expires_s" in raw else None,
            model=raw.get("model", ""),
            input_tokens=int(raw.get("input_tokens", 0)),
            invalid_lines=raw.get("invalid_lines", INVALID_LINES[0]),
            retry_of=raw.get("retry_of", ""),
        )


MAX_ACTIVE_JOBS = 1000  # jobs not yet ended, across tenants: past it, a create is refused (429)


class BatchRecords:
    """Reads and moves batch jobs; another tenant's job reads as none."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys
        self._move = redis.register_script(_MOVE_LUA)

    async def add(self, record: BatchRecord) -> None:
        """A new job: stored, listed for its tenant, and queued for a driver."""
        async with self._redis.pipeline(transaction=True) as pipe:
            mapping: dict[Any, Any] = record.fields()
            pipe.hset(self._keys.batch(record.batch_id), mapping=mapping)
            # Ordered to the microsecond: jobs made in one second keep their order.
            order = time.time_ns() // 1000
            pipe.zadd(self._keys.tenant_batches(record.tenant), {record.batch_id: order})
            pipe.zadd(self._keys.active_batches, {record.batch_id: order})
            await pipe.execute()

    async def get(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        """The job (``tenant``'s only, when given); None if unknown."""
        if not is_batch_id(batch_id):
            return None
        raw = await self._redis.hgetall(self._keys.batch(batch_id))
        if not raw:
            return None
        record = BatchRecord.from_fields(batch_id, {as_text(k): as_text(v) for k, v in raw.items()})
        return record if tenant is None or record.tenant == tenant else None

    async def move(
        self, batch_id: str, new: BatchStatus, allowed: tuple[BatchStatus, ...] | None = None, **fields: object
    ) -> BatchStatus | None:
        """Move the job to ``new`` from any state that may move there (or only from
        ``allowed``), stamping the time and setting ``fields``; the state it left, or None
        when it was not in one of them. A final move takes it off the drivers' queue."""
        sources = allowed or tuple(state for state, targets in MOVES.items() if new in targets)
        pairs = [part for name, value in fields.items() for part in (name, str(value))]
        left = await self._move(
            keys=[self._keys.batch(batch_id)],
            args=[",".join(sources), new.value, new.timestamp_field, int(time.time()), *pairs],
        )
        if left is None:
            return None
        if new.is_final:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self._keys.active_batches, batch_id)
                pipe.expire(self._keys.batch(batch_id), FINAL_TTL_S)
                pipe.delete(self._keys.batch_pending(batch_id))
                await pipe.execute()
        return BatchStatus(as_text(left))

    async def checkpoint(
        self,
        batch_id: str,
        started: Mapping[int, bytes] | None = None,
        finished: Sequence[int] = (),
        counts: Mapping[str, int] | None = None,
        **fields: object,
    ) -> None:
        """One step of the driver, in one transaction: lines started (each with what the
        driver noted of it), lines finished (off the running set), counts added, fields set."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if started:
                pipe.hset(self._keys.batch_pending(batch_id), mapping={str(k): v for k, v in started.items()})
            if finished:
                pipe.hdel(self._keys.batch_pending(batch_id), *(str(line) for line in finished))
            for name, amount in (counts or {}).items():
                if amount:
                    pipe.hincrby(self._keys.batch(batch_id), name, amount)
            if fields:
                pipe.hset(self._keys.batch(batch_id), mapping={name: str(value) for name, value in fields.items()})
            await pipe.execute()

    async def pending(self, batch_id: str) -> dict[int, bytes]:
        """The lines running now: line number -> what the driver noted of it."""
        raw = await self._redis.hgetall(self._keys.batch_pending(batch_id))
        return {
            int(as_text(line)): value if isinstance(value, bytes) else value.encode() for line, value in raw.items()
        }

    async def active(self, limit: int) -> list[str]:
        """Jobs not yet final, oldest first."""
        return [
            as_text(cast(bytes, batch_id))
            for batch_id in await self._redis.zrange(self._keys.active_batches, 0, limit - 1)
        ]

    async def tenants(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """Each job's tenant (jobs gone meanwhile left out), in one round trip."""
        if not batch_ids:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hget(self._keys.batch(batch_id), "tenant")
            found = await pipe.execute()
        return {batch_id: as_text(tenant) for batch_id, tenant in zip(batch_ids, found) if tenant is not None}

    async def lease(self, batch_id: str, holder: str, lease_s: float) -> bool:
        """Take or renew the right to drive the job for ``lease_s``; False if another holds it."""
        key = self._keys.batch_lease(batch_id)
        if await self._redis.set(key, holder, nx=True, px=int(lease_s * 1000)):
            return True
        if as_text(await self._redis.get(key) or b"") == holder:
            await self._redis.pexpire(key, int(lease_s * 1000))
            return True
        return False

    async def release(self, batch_id: str, holder: str) -> None:
        key = self._keys.batch_lease(batch_id)
        if as_text(await self._redis.get(key) or b"") == holder:
            await self._redis.delete(key)

    async def page(self, tenant: str, limit: int, after: str | None = None) -> tuple[list[BatchRecord], bool]:
        """Up to ``limit`` of the tenant's jobs, newest first, after the one named ``after``;
        and whether more follow."""
        index = self._keys.tenant_batches(tenant)
        start = 0
        if after is not None:
            rank = await self._redis.zrevrank(index, after)
            if rank is None:
                return [], False
            start = cast(int, rank) + 1
        ids = [
            as_text(cast(bytes, i)) for i in await self._redis.zrevrange(index, start, start + min(limit, MAX_LISTED))
        ]
        records = [record for record in [await self.get(i, tenant) for i in ids[:limit]] if record is not None]
        return records, len(ids) > limit

"""The records of uploaded and written files: whose each is, its name, size and purpose,
listed per tenant newest first. The bytes are in the object store (``core/object_store.py``)
under the file's id; a record is written only once they all are.

A file may expire (OpenAI's ``expires_after``, on an upload, or a batch's
``output_expires_after``, on its result files): ``expires_at`` seconds after its creation,
between an hour and 30 days. From then on it reads as gone; the storage sweep
(``api/openai/storage_sweep.py``) removes it, its bytes and its record, a bounded number a
round (``expired``).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from brimful.core.number_text import whole_number
from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

FILE_ID_PATTERN = re.compile(r"^file-[0-9a-f]{24}$")
# What a client may upload a file for, and what Brimful writes (a batch's output and errors).
UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"
# The most index entries one page reads while filtering by purpose.
MAX_SCANNED = 10_000
# ``expires_after``: counted from the file's creation, between OpenAI's bounds.
EXPIRY_ANCHOR = "created_at"
EXPIRES_AFTER_MIN_S = 3600
EXPIRES_AFTER_MAX_S = 30 * 24 * 3600


def expires_after_s(anchor: object, seconds: object) -> int:
    """The seconds of an ``expires_after`` of ``anchor`` and ``seconds`` (a JSON integer, or
    a multipart field's digits); ValueError naming what is wrong (an anchor other than
    ``created_at``, seconds not a whole number between the bounds)."""
    if anchor != EXPIRY_ANCHOR:
        raise ValueError(f"anchor must be {EXPIRY_ANCHOR}")
    number = whole_number(seconds, EXPIRES_AFTER_MIN_S, EXPIRES_AFTER_MAX_S)
    if number is None:
        raise ValueError(
            f"seconds must be a whole number from {EXPIRES_AFTER_MIN_S} to {EXPIRES_AFTER_MAX_S} (an hour to 30 days)"
        )
    return number


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class FileRecord:
    """One file, as stored and as OpenAI's File object shows it."""

    file_id: str
    tenant: str
    filename: str
    size: int
    purpose: str
    created_at: int  # unix seconds
    expires_at: int | None = None  # unix seconds; None: kept until deleted

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }

    def fields(self) -> dict[str, str]:
        return {
            "tenant": self.tenant,
            "filename": self.filename,
            "bytes": str(self.size),
            "purpose": self.purpose,
            "created_at": str(self.created_at),
            **({"expires_at": str(self.expires_at)} if self.expires_at is not None else {}),
        }

    @classmethod
    def from_fields(cls, file_id: str, fields: Mapping[str, str]) -> FileRecord:
        return cls(
            file_id,
            fields["tenant"],
            fields["filename"],
            int(fields["bytes"]),
            fields["purpose"],
            int(fields["created_at"]),
            int(fields["expires_at"]) if "expires_at" in fields else None,
        )


class FileRecords:
    """Reads and writes file records; another tenant's file reads as none."""

    def __init__(self, redis: RedisClient, keys: RedisKeys, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the wall clock in Unix seconds, against which files expire."""
        self._redis = redis
        self._keys = keys
        self._clock = clock

    async def add(self, record: FileRecord) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            mapping: dict[Any, Any] = record.fields()
            pipe.hset(self._keys.file(record.file_id), mapping=mapping)
            # Ordered by when it was added, to the microsecond: files made in one second keep their order.
            pipe.zadd(self._keys.tenant_files(record.tenant), {record.file_id: time.time_ns() // 1000})
            if record.expires_at is not None:
                pipe.zadd(self._keys.file_expiry, {record.file_id: record.expires_at})
            created, *_ = await pipe.execute()
        if created:  # a record written again (a job's result files joined after a crash) counts once
            await self._redis.hincrby(self._keys.stored_bytes, record.tenant, record.size)

    async def stored_bytes(self, tenant: str) -> int:
        """The bytes of the tenant's files (its uploads and its jobs' results)."""
        return int(await self._redis.hget(self._keys.stored_bytes, tenant) or 0)

    async def exists(self, file_ids: list[str]) -> list[bool]:
        """Whether each file has a record, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for file_id in file_ids:
                pipe.exists(self._keys.file(file_id))
            return [bool(found) for found in await pipe.execute()]

    async def get(self, file_id: str, tenant: str) -> FileRecord | None:
        """The tenant's file; None when unknown or another tenant's (so ids cannot be probed)."""
        if not FILE_ID_PATTERN.match(file_id):
            return None
        raw = await self._redis.hgetall(self._keys.file(file_id))
        if not raw:
            return None
        record = FileRecord.from_fields(file_id, {as_text(k): as_text(v) for k, v in raw.items()})
        return record if record.tenant == tenant and not record.expired(self._clock()) else None

    async def expired(self, most: int) -> list[FileRecord]:
        """Up to ``most`` files past their expiry, soonest expired first."""
        ids = [
            as_text(cast(bytes, file_id))
            for file_id in await self._redis.zrangebyscore(self._keys.file_expiry, "-inf", self._clock(), 0, most)
        ]
        async with self._redis.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hgetall(self._keys.file(file_id))
            raws = await pipe.execute() if ids else []
        found = []
        for file_id, raw in zip(ids, raws):
            if raw:
                found.append(FileRecord.from_fields(file_id, {as_text(k): as_text(v) for k, v in raw.items()}))
            else:  # its record was deleted: only its place in the expiry index is left
                await self._redis.zrem(self._keys.file_expiry, file_id)
        return found

    async def remove(self, record: FileRecord) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._keys.file(record.file_id))
            pipe.zrem(self._keys.tenant_files(record.tenant), record.file_id)
            pipe.zrem(self._keys.file_expiry, record.file_id)
            removed, *_ = await pipe.execute()
        if removed:  # this call removed it: its bytes leave the tenant's count once
            await self._redis.hincrby(self._keys.stored_bytes, record.tenant, -record.size)

    async def page(
        self, tenant: str, limit: int, after: str | None = None, purpose: str | None = None, newest_first: bool = True
    ) -> tuple[list[FileRecord], bool]:
        """Up to ``limit`` of the tenant's files after the one named ``after`` (in the
        order asked), of ``purpose`` if given; and whether more follow."""
        index = self._keys.tenant_files(tenant)
        start = 0
        if after is not None:
            rank = await (self._redis.zrevrank if newest_first else self._redis.zrank)(index, after)
            if rank is None:
                return [], False
            start = cast(int, rank) + 1
        found: list[FileRecord] = []
        scanned = 0
        while len(found) <= limit:
            if scanned >= MAX_SCANNED:  # a filter that matches little: stop, and say more may follow
                return found[:limit], True
            window = min(limit + 1 - len(found), MAX_SCANNED - scanned)
            ids = [
                as_text(cast(bytes, file_id))
                for file_id in await (self._redis.zrevrange if newest_first else self._redis.zrange)(
                    index, start, start + window - 1
                )
            ]
            if not ids:
                break
            start += len(ids)
            scanned += len(ids)
            async with self._redis.pipeline(transaction=False) as pipe:
                for file_id in ids:
                    pipe.hgetall(self._keys.file(file_id))
                raws = await pipe.execute()
            for file_id, raw in zip(ids, raws):
                if not raw:
                    continue  # removed a moment ago
                record = FileRecord.from_fields(file_id, {as_text(k): as_text(v) for k, v in raw.items()})
                if record.tenant != tenant or record.expired(self._clock()):
                    continue
                if purpose is None or record.purpose == purpose:
                    found.append(record)
        return found[:limit], len(found) > limit

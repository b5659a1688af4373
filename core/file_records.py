"""The records of uploaded and written files: whose each is, its name, size and purpose,
listed per tenant newest first. The bytes are in the object store (``core/object_store.py``)
under the file's id; a record is written only once they all are.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from brimful.core.redis_client import RedisClient, as_text
from brimful.core.redis_keys import RedisKeys

FILE_ID_PATTERN = re.compile(r"^file-[0-9a-f]{24}$")
# What a client may upload a file for, and what Brimful writes (a batch's output and errors).
UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"
# The most index entries one page reads while filtering by purpose.
MAX_SCANNED = 10_000


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

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }

    def fields(self) -> dict[str, str]:
        return {
            "tenant": self.tenant,
            "filename": self.filename,
            "bytes": str(self.size),
            "purpose": self.purpose,
            "created_at": str(self.created_at),
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
        )


class FileRecords:
    """Reads and writes file records; another tenant's file reads as none."""

    def __init__(self, redis: RedisClient, keys: RedisKeys) -> None:
        self._redis = redis
        self._keys = keys

    async def add(self, record: FileRecord) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            mapping: dict[Any, Any] = record.fields()
            pipe.hset(self._keys.file(record.file_id), mapping=mapping)
            # Ordered by when it was added, to the microsecond: files made in one second keep their order.
            pipe.zadd(self._keys.tenant_files(record.tenant), {record.file_id: time.time_ns() // 1000})
            created, _ = await pipe.execute()
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
        return record if record.tenant == tenant else None

    async def remove(self, record: FileRecord) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._keys.file(record.file_id))
            pipe.zrem(self._keys.tenant_files(record.tenant), record.file_id)
            removed, _ = await pipe.execute()
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
                if record.tenant == tenant and (purpose is None or record.purpose == purpose):
                    found.append(record)
        return found[:limit], len(found) > limit

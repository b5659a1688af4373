"""Removing what the object store holds that nothing points to any more.

An upload or a write cut by a crash leaves an object under its temporary name
(``core/object_store.WRITING``); a crash between an object's move to its name and its
record leaves a file with no record; a job that ended by a path that never deleted its
result parts leaves them. Every ``SWEEP_S`` one API worker (the one that takes the round's
lease in Redis) lists up to ``MAX_LISTED`` objects and removes those older than twice the
longest upload (``file_upload_max_s``) that are one of these: written objects never
finished, files without a record, parts of a job that has ended or is gone. Before that,
it removes up to ``MAX_EXPIRED`` files past their ``expires_at``: their bytes, then their
records.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from redis.exceptions import RedisError

from brimful.api.state import ApiState
from brimful.core.batch_records import is_batch_id
from brimful.core.file_records import FILE_ID_PATTERN
from brimful.core.object_store import WRITING, StoredObject

log = logging.getLogger("brimful.api")

SWEEP_S = 300.0
MAX_LISTED = 10_000
MAX_EXPIRED = 1000  # expired files removed a round
_PART = re.compile(r"^(batch_[0-9a-f]{24})\.(output|errors)\.[0-9]+$")


class StorageSweep:
    """The sweep of one API worker; ``run`` for the life of the process."""

    def __init__(self, state: ApiState, every_s: float = SWEEP_S) -> None:
        self._state = state
        self._every_s = every_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                if await self._take_round():
                    expired = await self.remove_expired()
                    if expired:
                        log.info("storage sweep: expired files removed", extra={"files": expired})
                    removed = await self.sweep()
                    if removed:
                        log.warning("storage sweep: objects nothing points to removed", extra={"objects": removed})
            except (RedisError, OSError) as error:
                log.warning("storage sweep failed; next round tries again", extra={"error": str(error)})

    async def _take_round(self) -> bool:
        key = f"{self._state.settings.key_prefix}:storage-sweep"
        return bool(await self._state.redis.set(key, "1", nx=True, px=int(self._every_s * 1000 * 0.9)))

    async def remove_expired(self) -> int:
        """Remove up to ``MAX_EXPIRED`` files past their expiry, bytes first (a crash in
        between leaves a record that reads as gone, removed next round); how many."""
        expired = await self._state.file_records.expired(MAX_EXPIRED)
        for record in expired:
            await self._state.object_store.delete(record.file_id)
            await self._state.file_records.remove(record)
        return len(expired)

    async def sweep(self) -> int:
        """Remove the objects nothing points to; how many."""
        old_before = time.time() - 2 * self._state.settings.file_upload_max_s
        objects = [
            found for found in await self._state.object_store.listing(MAX_LISTED) if found.modified_s < old_before
        ]
        doomed = [found.name for found in objects if WRITING in found.name]
        doomed += await self._files_without_records(objects)
        doomed += await self._parts_of_ended_jobs(objects)
        for name in doomed:
            await self._state.object_store.delete(name)
        return len(doomed)

    async def _files_without_records(self, objects: list[StoredObject]) -> list[str]:
        names = [found.name for found in objects if FILE_ID_PATTERN.match(found.name)]
        exists = await self._state.file_records.exists(names) if names else []
        return [name for name, found in zip(names, exists) if not found]

    async def _parts_of_ended_jobs(self, objects: list[StoredObject]) -> list[str]:
        parts = [(found.name, match[1]) for found in objects if (match := _PART.match(found.name))]
        jobs = {batch_id for _, batch_id in parts if is_batch_id(batch_id)}
        ended = set()
        for batch_id in jobs:
            record = await self._state.batch_records.get(batch_id)
            if record is None or record.status.is_final:
                ended.add(batch_id)
        return [name for name, batch_id in parts if batch_id in ended]

"""On-call work on the dead-letter queue: list, show, replay, purge, export.

The DLQ is an append-only Kafka topic, so what on-call did to an entry (replayed it,
purged it) is kept beside it in Redis, keyed by the entry's place in the topic
(``partition-offset``). Listing reads the topic from the start; dead letters are rare,
so that stays cheap, and the topic's own retention bounds it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka import AIOKafkaProducer
from google.protobuf.json_format import MessageToDict
from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.kafka import read_whole_topic
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.task_store import TaskStore
from brimful.schemas import DeadLetter


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which entries an action applies to; empty fields match everything."""

    since_ms: int | None = None
    until_ms: int | None = None
    error_class: str | None = None
    model: str | None = None
    ids: tuple[str, ...] = ()  # entry ids or task ids
    include_resolved: bool = False
    tenant: str | None = None  # only this tenant's entries; None: every tenant's

    def matches(self, entry: "DeadLetterEntry") -> bool:
        letter = entry.letter
        if self.tenant is not None and letter.request.tenant != self.tenant:
            return False
        if self.ids and entry.entry_id not in self.ids and letter.request.task_id not in self.ids:
            return False
        if not self.include_resolved and entry.resolution is not None:
            return False
        if self.since_ms is not None and letter.failed_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and letter.failed_at_ms > self.until_ms:
            return False
        if self.error_class and letter.error_class != self.error_class:
            return False
        return not (self.model and letter.model != self.model)


@dataclass(frozen=True)
class DeadLetterEntry:
    """One dead letter, where it sits in the DLQ topic, and what on-call did about it."""

    entry_id: str
    letter: DeadLetter
    resolution: dict[str, Any] | None

    def summary(self) -> dict[str, Any]:
        letter = self.letter
        return {
            "id": self.entry_id,
            "task_id": letter.request.task_id,
            "failed_at_ms": letter.failed_at_ms,
            "error_class": letter.error_class,
            "error_message": letter.error_message,
            "model": letter.model,
            "attempts": len(letter.attempts),
            "batch_id": letter.batch_id,
            "status": self.resolution["action"] if self.resolution else "open",
        }

    def details(self) -> dict[str, Any]:
        letter = MessageToDict(self.letter, preserving_proto_field_name=True)
        return {**self.summary(), "resolution": self.resolution, "letter": letter}


class DeadLetterAdmin:
    """The operations behind ``brimful dlq`` and the ``/v1/admin/dlq`` endpoints."""

    def __init__(self, settings: Settings, redis: Redis, producer: AIOKafkaProducer, store: TaskStore) -> None:
        self._settings = settings
        self._redis = redis
        self._producer = producer
        self._store = store
        self._keys = RedisKeys(settings.key_prefix)

    async def entries(self, selection: DeadLetterFilter) -> list[DeadLetterEntry]:
        """Every matching entry, oldest first."""
        resolutions = {
            key.decode(): json.loads(value) for key, value in (await self._redis.hgetall(self._keys.dlq_resolved)).items()
        }
        found = []
        for partition, offset, value in await read_whole_topic(self._settings, self._settings.dlq_topic):
            entry_id = f"{partition}-{offset}"
            entry = DeadLetterEntry(entry_id, DeadLetter.FromString(value), resolutions.get(entry_id))
            if selection.matches(entry):
                found.append(entry)
        return sorted(found, key=lambda e: (e.letter.failed_at_ms, e.entry_id))

    async def replay(self, selection: DeadLetterFilter, actor: str) -> tuple[list[str], list[str]]:
        """Send matching open entries back to the requests topic with their task_ids; the
        tasks read ``queued`` again. Returns (replayed task ids, skipped entry ids)."""
        replayed, skipped = [], []
        for entry in await self.entries(DeadLetterFilter(**{**vars(selection), "include_resolved": False})):
            request = entry.letter.request
            if not request.inputs:  # an undecodable record: nothing to send again
                skipped.append(entry.entry_id)
                continue
            await self._store.requeue(request.task_id, request.submitted_at_ms, request.tenant)
            await self._producer.send_and_wait(
                self._settings.requests_topic, request.SerializeToString(), key=request.task_id.encode()
            )
            await self._resolve([entry], "replayed", actor)
            replayed.append(request.task_id)
        return replayed, skipped

    async def purge(self, selection: DeadLetterFilter, actor: str) -> list[str]:
        """Mark matching open entries purged: they leave the default listing for good."""
        entries = await self.entries(DeadLetterFilter(**{**vars(selection), "include_resolved": False}))
        await self._resolve(entries, "purged", actor)
        return [entry.entry_id for entry in entries]

    @staticmethod
    def export(entries: Iterable[DeadLetterEntry]) -> bytes:
        """The entries as a Parquet file: one row each, the error first."""
        rows = list(entries)
        table = pa.table(
            {
                "id": [e.entry_id for e in rows],
                "task_id": [e.letter.request.task_id for e in rows],
                "failed_at_ms": pa.array([e.letter.failed_at_ms for e in rows], pa.int64()),
                "error_class": [e.letter.error_class for e in rows],
                "error_message": [e.letter.error_message for e in rows],
                "model": [e.letter.model for e in rows],
                "model_version": [e.letter.model_version for e in rows],
                "attempts": pa.array([len(e.letter.attempts) for e in rows], pa.int32()),
                "batch_id": [e.letter.batch_id for e in rows],
                "batch_task_ids": [list(e.letter.batch_task_ids) for e in rows],
                "source_partition": pa.array([e.letter.source_partition for e in rows], pa.int32()),
                "source_offset": pa.array([e.letter.source_offset for e in rows], pa.int64()),
                "status": [e.summary()["status"] for e in rows],
                "request": [e.letter.request.SerializeToString() for e in rows],
            }
        )
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()

    async def _resolve(self, entries: list[DeadLetterEntry], action: str, actor: str) -> None:
        if not entries:
            return
        record = json.dumps({"action": action, "at_ms": now_ms(), "actor": actor})
        await self._redis.hset(self._keys.dlq_resolved, mapping={entry.entry_id: record for entry in entries})

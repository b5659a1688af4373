"""On-call work on the dead-letter queue: list, show, replay, purge, export.

The DLQ is an append-only Kafka topic, so what on-call did to an entry (replayed it,
purged it) is kept beside it in Redis, keyed by the entry's place in the topic
(``partition-offset``). Entries named by id (their place, or a task id, found through
``core/dead_letter_index.py``) are read at their places. Other operations stream the topic
a fetch at a time and work in pages that resume from a cursor (the id of the next entry to
read), and one call reads at most ``read_max`` letters, so a DLQ of a hundred thousand
letters is listed, exported and replayed in bounded memory and bounded time per call. At
most ``SCANS_AT_ONCE`` calls read the topic at once in an API process (429 past a short
wait); the routes also take a token per call from the tenant's DLQ bucket.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka import AIOKafkaProducer

from brimful.api.admin.dead_letter_entries import EXPORT_SCHEMA, DeadLetterEntry, DeadLetterFilter, Page, parse_cursor
from brimful.api.http.bodies import ApiError
from brimful.core.clock import now_ms
from brimful.core.dead_letter_index import DeadLetterIndex, entry_id
from brimful.core.kafka import read_at, stream_topic
from brimful.core.redis_client import RedisClient
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.task_store import TaskStore
from brimful.schemas import DeadLetter

# The most entries one page answers, replays or purges; the default page. A bigger job is
# several calls, each resuming at the cursor the last one returned (``brimful dlq`` loops).
PAGE_LIMIT_MAX = 10_000
PAGE_LIMIT_DEFAULT = 1_000
# Entries written to the Parquet export per row group: the export's memory is one group.
EXPORT_ROW_GROUP = 1_000
# Replayed entries sent, acknowledged and marked together.
_REPLAY_GROUP = 500
# Calls reading the topic at once in one API process, and how long another waits for a turn.
SCANS_AT_ONCE = 2
SCAN_TURN_WAIT_S = 5.0


class _ChunkSink:
    """A write-only file that hands what was written to whoever drains it: lets the
    Parquet writer's output leave a row group at a time instead of piling up."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._written = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        return self._written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def drain(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class DeadLetterAdmin:
    """The operations behind ``brimful dlq`` and the ``/v1/admin/dlq`` endpoints."""

    def __init__(
        self,
        settings: Settings,
        redis: RedisClient,
        producer: AIOKafkaProducer,
        store: TaskStore,
        read_max: int = 20_000,
    ) -> None:
        """``read_max``: the most letters one call reads from the topic."""
        self._settings = settings
        self._served = frozenset(settings.served_models)
        self._redis = redis
        self._producer = producer
        self._store = store
        self._keys = RedisKeys(settings.key_prefix)
        self._index = DeadLetterIndex(redis, self._keys, settings.task_wait_ttl_s)
        self.read_max = read_max
        self._turns = asyncio.Semaphore(SCANS_AT_ONCE)

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """One of the SCANS_AT_ONCE turns to read the topic; 429 after SCAN_TURN_WAIT_S."""
        try:
            await asyncio.wait_for(self._turns.acquire(), SCAN_TURN_WAIT_S)
        except TimeoutError:
            raise ApiError(
                429, "dlq_busy", f"{SCANS_AT_ONCE} DLQ calls are reading the topic; retry shortly", retry_after_s=1
            ) from None
        try:
            yield
        finally:
            self._turns.release()

    async def _entries(self, chunk: list[tuple[int, int, bytes]]) -> list[DeadLetterEntry]:
        """The letters of a chunk of records, with what on-call did to each (one round trip)."""
        if not chunk:
            return []
        ids = [entry_id(partition, offset) for partition, offset, _ in chunk]
        done = await self._redis.hmget(self._keys.dlq_resolved, ids)
        return [
            DeadLetterEntry(place, DeadLetter.FromString(value), json.loads(resolution) if resolution else None)
            for place, (_, _, value), resolution in zip(ids, chunk, done)
        ]

    async def scan(
        self, selection: DeadLetterFilter, after: str | None = None
    ) -> AsyncGenerator[tuple[DeadLetterEntry | None, str], None]:
        """Every letter from ``after`` (an entry id; None: the start) in topic order, as
        (the entry if it matches else None, its id); what on-call did to each is read per
        fetch, so memory stays at one fetch."""
        start = parse_cursor(after) if after else None
        async with aclosing(stream_topic(self._settings, self._settings.dlq_topic, start)) as chunks:
            async for chunk in chunks:
                for entry in await self._entries(chunk):
                    yield (entry if selection.matches(entry) else None), entry.entry_id

    async def _at_places(self, selection: DeadLetterFilter) -> list[DeadLetterEntry] | None:
        """The entries ``selection.ids`` names, read at their places (entry ids as they
        are, task ids through the index), in topic order; None when a task id has no
        recorded place (its letters are found by a scan)."""
        places: list[str] = []
        task_ids: list[str] = []
        for named in selection.ids:
            try:
                parse_cursor(named)
                places.append(named)
            except ValueError:
                task_ids.append(named)
        indexed = await self._index.places(task_ids)
        if len(indexed) < len(task_ids):
            return None
        places += [place for found in indexed.values() for place in found]
        ordered = sorted({parse_cursor(place) for place in places})
        records = await read_at(self._settings, self._settings.dlq_topic, ordered)
        return [entry for entry in await self._entries(records) if selection.matches(entry)]

    async def page(self, selection: DeadLetterFilter, after: str | None, limit: int) -> Page:
        """Up to ``limit`` matching entries from ``after``, in topic order. Reads at most
        ``read_max`` letters: past them, the page ends early and says where to go on."""
        async with self._turn():
            if selection.ids:
                named = await self._at_places(selection)
                if named is not None:
                    start = parse_cursor(after) if after else (-1, -1)
                    later = [entry for entry in named if parse_cursor(entry.entry_id) >= start]
                    following = later[limit].entry_id if len(later) > limit else None
                    return Page(later[:limit], following, len(named))
            taken: list[DeadLetterEntry] = []
            read = 0
            async with aclosing(self.scan(selection, after)) as letters:
                async for entry, place in letters:
                    if len(taken) == limit or read == self.read_max:  # the next page starts here
                        return Page(taken, place, read)
                    read += 1
                    if entry is not None:
                        taken.append(entry)
            return Page(taken, None, read)

    async def count(self, selection: DeadLetterFilter) -> tuple[Counter[str], bool]:
        """How many entries match, by error class, among the first ``read_max`` letters
        (one streamed pass), and whether that was every letter."""
        counts: Counter[str] = Counter()
        read = 0
        async with self._turn(), aclosing(self.scan(selection)) as letters:
            async for entry, _ in letters:
                if read == self.read_max:
                    return counts, False
                read += 1
                if entry is not None:
                    counts[entry.letter.error_class] += 1
        return counts, True

    async def find(self, entry_or_task: str, tenant: str | None) -> DeadLetterEntry | None:
        """One entry by its id, or the latest for a task id, read at its place; a task
        whose letters' places were not recorded is looked for in a bounded scan."""
        selection = DeadLetterFilter(ids=(entry_or_task,), include_resolved=True, tenant=tenant)
        async with self._turn():
            named = await self._at_places(selection)
            if named is not None:
                return named[-1] if named else None
            found = None
            read = 0
            async with aclosing(self.scan(selection)) as letters:
                async for entry, _ in letters:
                    read += 1
                    if entry is not None:
                        found = entry
                    if read == self.read_max:
                        break
            return found

    async def replay(
        self, selection: DeadLetterFilter, actor: str, after: str | None, limit: int, dry_run: bool = False
    ) -> tuple[Page, list[str], list[str]]:
        """Send up to ``limit`` matching open entries back to their model's requests topic
        with their task_ids; the tasks read ``queued`` again. Returns (the page, replayed
        task ids, skipped entry ids): an entry with nothing to send, or for a model no
        longer served, is skipped, and so is one whose task is not ``failed`` (done since,
        cancelled, or requeued by another letter of it: a task may have two, after a
        rebalance or a retried batch), which is marked so: a replay never reopens a task.
        ``dry_run`` says what would be replayed and changes nothing."""
        page = await self.page(replace(selection, include_resolved=False), after, limit)
        replayed, skipped, group = [], [], []
        for entry in page.entries:
            request = entry.letter.request
            # An undecodable or trimmed record has nothing to send again; a model no longer
            # served has no batcher to take it.
            if not request.inputs or (request.model or self._settings.default_model) not in self._served:
                skipped.append(entry.entry_id)
                continue
            group.append(entry)
            if len(group) == _REPLAY_GROUP and not dry_run:
                sent, kept = await self._send_again(group, actor)
                replayed += sent
                skipped += kept
                group = []
        if dry_run:
            replayed = list(dict.fromkeys(entry.letter.request.task_id for entry in group))
        else:
            sent, kept = await self._send_again(group, actor)
            replayed += sent
            skipped += kept
        return page, replayed, skipped

    async def _send_again(self, entries: list[DeadLetterEntry], actor: str) -> tuple[list[str], list[str]]:
        """Requeue, send and mark replayed one group: each task reads ``queued`` before the
        batcher can see its record, and a dropped call re-sends at most one group. Returns
        (the task ids sent, the entry ids left because their task is not failed)."""
        sends, sent, kept = [], [], []
        for entry in entries:
            request = entry.letter.request
            status = await self._store.requeue(request.task_id, request.submitted_at_ms, request.tenant, request.model)
            if status is not None:
                kept.append((entry, status))
                continue
            sent.append(entry)
            sends.append(
                await self._producer.send(
                    self._settings.topic_generations_for(request.model or self._settings.default_model).topic_at(
                        now_ms() / 1000
                    ),
                    request.SerializeToString(),
                    key=request.task_id.encode(),
                )
            )
        await asyncio.gather(*sends)
        await self._resolve(sent, "replayed", actor)
        for entry, status in kept:
            await self._resolve([entry], "not_replayed", actor, f"its task is {status}, not failed")
        return [entry.letter.request.task_id for entry in sent], [entry.entry_id for entry, _ in kept]

    async def purge(self, selection: DeadLetterFilter, actor: str, after: str | None, limit: int) -> Page:
        """Mark up to ``limit`` matching open entries purged: they leave the default listing."""
        page = await self.page(replace(selection, include_resolved=False), after, limit)
        await self._resolve(page.entries, "purged", actor)
        return page

    async def export(self, selection: DeadLetterFilter) -> AsyncGenerator[bytes, None]:
        """Every matching entry as a Parquet file, streamed a row group at a time (the one
        call that reads the whole topic: it holds a turn while it does)."""
        sink = _ChunkSink()
        writer = pq.ParquetWriter(pa.PythonFile(sink, mode="w"), EXPORT_SCHEMA)
        rows: list[dict[str, Any]] = []
        async with self._turn(), aclosing(self.scan(selection)) as letters:
            async for entry, _ in letters:
                if entry is None:
                    continue
                rows.append(entry.row())
                if len(rows) == EXPORT_ROW_GROUP:
                    writer.write_table(pa.Table.from_pylist(rows, EXPORT_SCHEMA))
                    rows = []
                    yield sink.drain()
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, EXPORT_SCHEMA))
        writer.close()
        yield sink.drain()

    async def _resolve(self, entries: list[DeadLetterEntry], action: str, actor: str, reason: str = "") -> None:
        if not entries:
            return
        record = json.dumps(
            {"action": action, "at_ms": now_ms(), "actor": actor, **({"reason": reason} if reason else {})}
        )
        await self._redis.hset(self._keys.dlq_resolved, mapping={entry.entry_id: record for entry in entries})

"""The DLQ at scale, on the real broker and Redis: 20,000 dead letters over two partitions,
listed page by page, counted, exported and replayed (dry run) and purged in pages, with the
admin's Python memory far below the letters' own size."""

from __future__ import annotations

import asyncio
import tracemalloc
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from brimful.api.admin.dead_letter_admin import DeadLetterAdmin
from brimful.api.admin.dead_letter_entries import DeadLetterFilter
from brimful.core.dead_letter_index import DeadLetterIndex
from brimful.core.kafka import connection_options, make_producer
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.task_store import TaskStore
from brimful.schemas import DeadLetter, TaskRequest
from brimful.stack import EmbeddedStack

LETTERS = 20_000
INPUT_BYTES = 2_000  # per letter: 40 MB of letters in all
FAILED_AT_MS = 1_700_000_000_000


def _letter(index: int) -> DeadLetter:
    tenant = "t1" if index % 4 else "t2"  # a quarter belong to t2
    request = TaskRequest(task_id=f"scale-{index:06d}", tenant=tenant, submitted_at_ms=FAILED_AT_MS)
    request.inputs["TEXT"].datatype = "BYTES"
    request.inputs["TEXT"].bytes_contents.append((b"%06d" % index) * (INPUT_BYTES // 6))
    error_class = "model_error" if index % 3 else "unavailable"
    return DeadLetter(request=request, error_class=error_class, error_message="boom", failed_at_ms=FAILED_AT_MS + index)


@pytest.fixture(scope="module")
async def scale(stack: EmbeddedStack) -> AsyncIterator[tuple[DeadLetterAdmin, Settings]]:
    """A DLQ topic of its own (two partitions) holding LETTERS letters, and an admin on it."""
    run = uuid.uuid4().hex[:8]
    settings = stack.settings.model_copy(update={"dlq_topic": f"dlq-scale-{run}", "key_prefix": f"scale{run}"})
    admin_client = AIOKafkaAdminClient(**connection_options(settings))
    await admin_client.start()
    try:
        await admin_client.create_topics([NewTopic(settings.dlq_topic, 2, 1)])
    finally:
        await admin_client.close()
    producer = make_producer(settings)
    await producer.start()
    redis = make_redis(settings)
    try:
        for start in range(0, LETTERS, 2_000):
            sends = [
                await producer.send(settings.dlq_topic, _letter(i).SerializeToString(), partition=i % 2)
                for i in range(start, min(LETTERS, start + 2_000))
            ]
            await asyncio.gather(*sends)
        keys = RedisKeys(settings.key_prefix)
        yield DeadLetterAdmin(settings, redis, producer, TaskStore(redis, keys, ttl_s=60)), settings
    finally:
        await producer.stop()
        await redis.aclose()


async def test_every_letter_is_listed_once_page_by_page_across_partitions(
    scale: tuple[DeadLetterAdmin, Settings],
) -> None:
    admin, _ = scale
    seen: Counter[str] = Counter()
    after, pages = None, 0
    while True:
        page = await admin.page(DeadLetterFilter(), after, 3_000)
        assert len(page.entries) <= 3_000
        seen.update(entry.letter.request.task_id for entry in page.entries)
        pages += 1
        after = page.next_cursor
        if after is None:
            break
    assert len(seen) == LETTERS and set(seen.values()) == {1}
    assert pages == -(-LETTERS // 3_000)

    counts, complete = await admin.count(DeadLetterFilter(tenant="t2"))
    assert complete and sum(counts.values()) == LETTERS // 4
    assert counts == Counter(_letter(i).error_class for i in range(0, LETTERS, 4))


async def test_export_streams_in_bounded_memory(scale: tuple[DeadLetterAdmin, Settings], tmp_path: Path) -> None:
    admin, _ = scale
    out = tmp_path / "dlq.parquet"
    tracemalloc.start()
    try:
        with out.open("wb") as sink:
            async for chunk in admin.export(DeadLetterFilter()):
                sink.write(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole = LETTERS * INPUT_BYTES
    # Reading the topic whole would hold every letter at once (> 40 MB); a stream holds a fetch
    # and a row group.
    assert peak < whole / 3, f"peak {peak / 1e6:.1f} MB for {whole / 1e6:.0f} MB of letters"
    table = pq.read_table(out, columns=["task_id", "error_class"])
    assert table.num_rows == LETTERS
    assert len(set(table.column("task_id").to_pylist())) == LETTERS
    assert pq.ParquetFile(out).num_row_groups > 1


async def test_replay_dry_run_changes_nothing_and_purge_works_in_pages(scale: tuple[DeadLetterAdmin, Settings]) -> None:
    admin, settings = scale
    keys = RedisKeys(settings.key_prefix)
    t2 = DeadLetterFilter(tenant="t2")
    would, after = [], None
    while True:
        page, replayed, skipped = await admin.replay(t2, "key test", after, 2_000, dry_run=True)
        would.extend(replayed)
        assert not skipped
        after = page.next_cursor
        if after is None:
            break
    assert sorted(would) == [f"scale-{i:06d}" for i in range(0, LETTERS, 4)]
    assert await admin._redis.hlen(keys.dlq_resolved) == 0  # nothing marked
    assert await admin._store.get(would[0]) is None  # nothing requeued

    purged, after = 0, None
    while True:
        page = await admin.purge(t2, "key test", after, 1_500)
        purged += len(page.entries)
        after = page.next_cursor
        if after is None:
            break
    assert purged == LETTERS // 4
    assert sum((await admin.count(t2))[0].values()) == 0  # purged entries leave the default listing
    assert sum((await admin.count(DeadLetterFilter(tenant="t1")))[0].values()) == LETTERS - LETTERS // 4
    found = await admin.find("scale-000004", "t2")
    assert found is not None and found.resolution is not None and found.resolution["action"] == "purged"


async def test_one_call_reads_at_most_its_bound_and_says_where_to_go_on(
    scale: tuple[DeadLetterAdmin, Settings],
) -> None:
    admin, _ = scale
    bound, admin.read_max = admin.read_max, 1_000
    try:
        t2 = DeadLetterFilter(tenant="t2", include_resolved=True)
        page = await admin.page(t2, None, 3_000)
        # The first 1,000 letters read are partition 0's (even indexes): half of them are t2's.
        assert page.read == 1_000 and len(page.entries) == 500 and page.next_cursor is not None
        rest = await admin.page(t2, page.next_cursor, 3_000)
        assert rest.read == 1_000 and {e.entry_id for e in rest.entries}.isdisjoint(e.entry_id for e in page.entries)
        counts, complete = await admin.count(t2)
        assert not complete and sum(counts.values()) == 500
    finally:
        admin.read_max = bound


async def test_a_task_whose_letters_are_indexed_is_read_at_their_places(
    scale: tuple[DeadLetterAdmin, Settings],
) -> None:
    admin, settings = scale
    # The last letter of partition 1, indexed as a batcher indexes what it writes: a scan
    # bounded to one letter would never reach it.
    last = LETTERS - 1
    index = DeadLetterIndex(admin._redis, RedisKeys(settings.key_prefix), 60)
    await index.add([(_letter(last).request.task_id, 1, last // 2)])
    bound, admin.read_max = admin.read_max, 1
    try:
        found = await admin.find(_letter(last).request.task_id, None)
        assert found is not None and found.entry_id == f"1-{last // 2}"
        assert found.letter.request.task_id == _letter(last).request.task_id
        page = await admin.page(DeadLetterFilter(ids=(_letter(last).request.task_id,), include_resolved=True), None, 10)
        assert [entry.entry_id for entry in page.entries] == [f"1-{last // 2}"] and page.next_cursor is None
    finally:
        admin.read_max = bound

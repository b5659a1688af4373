"""A fetch that skips an offset, against the real broker: the batcher reads the gap again.

The embedded broker can number a record before it can serve it (two producers writing one
partition at once); a fetch then returns the records after it and skips it. The race can't
be forced on the broker, so these tests inject the fault where it lands: the batcher's real
consumer, fetching from the real broker, has one record taken out of what a fetch returns
(only from the middle of a fetch, so the consumer's position stays where the broker's
answer put it). A batcher run in-process on a topic and key prefix of its own, with the
shared stack's Redis and model, must then finish every task, the skipped one too, and
commit past it only once it is done; a record that never turns up (a real gap, as
compaction leaves on Apache Kafka) must not hold the partition for longer than its patience.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from brimful.batcher import main as batcher_main
from brimful.core.clock import now_ms
from brimful.core.kafka import ensure_topics, make_producer
from brimful.core.model_catalogue import TensorSpec, encode_input
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.task_record import TaskStatus
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import committed_offset, expected_outputs

TASKS = 12
TEXT_SPEC = TensorSpec("TEXT", "BYTES", (1,))
HIDDEN = 5  # the offset a fetch skips: in the middle of the one batch the tasks are produced in


class SkippingFetches:
    """Takes the record at ``offset`` out of what the consumer's fetches return: the first
    ``times`` fetches that carry it with a record after it (0: every one)."""

    def __init__(self, consumer: AIOKafkaConsumer, offset: int, times: int) -> None:
        self.offset = offset
        self.times = times
        self.skipped = 0
        self._getmany = consumer.getmany
        consumer.getmany = self.getmany  # type: ignore[method-assign]

    async def getmany(self, *partitions: TopicPartition, **options: Any) -> dict[TopicPartition, list[ConsumerRecord]]:
        fetched = await self._getmany(*partitions, **options)
        if self.times and self.skipped >= self.times:
            return fetched
        for tp, records in fetched.items():
            offsets = [record.offset for record in records]
            if self.offset in offsets and offsets[-1] > self.offset:
                fetched[tp] = [record for record in records if record.offset != self.offset]
                self.skipped += 1
        return fetched


def gap_settings(stack: EmbeddedStack) -> Settings:
    """The stack's servers, a topic, group and key prefix of this test's own."""
    run = uuid.uuid4().hex[:8]
    return stack.settings.model_copy(
        update={
            "requests_topic": f"brimful.gaps-{run}",
            "dlq_topic": f"brimful.gaps-dlq-{run}",
            "consumer_group": f"brimful-gaps-{run}",
            "key_prefix": f"gaps-{run}:",
            "topic_partitions": 1,
            "batcher_metrics_port": 0,
            "trace_dir": "",
        }
    )


async def fill(settings: Settings, store: TaskStore, skip_task: bool) -> list[str]:
    """Record TASKS queued tasks and produce them in one record batch (offsets 0..TASKS-1).
    With ``skip_task``, the record at HIDDEN stands for one that is not there: no task is
    recorded for it."""
    await ensure_topics(settings)
    task_ids = [uuid.uuid4().hex for _ in range(TASKS)]
    submitted = now_ms()
    for index, task_id in enumerate(task_ids):
        if not (skip_task and index == HIDDEN):
            await store.create_queued(task_id, submitted)
    producer = make_producer(settings)
    await producer.start()
    try:
        # One record batch, so a fetch from offset 0 carries them all and HIDDEN sits inside it.
        batch = producer.create_batch()
        for task_id in task_ids:
            request = TaskRequest(task_id=task_id, model=settings.model_name, submitted_at_ms=submitted)
            request.inputs["TEXT"].CopyFrom(encode_input(TEXT_SPEC, f"gap {task_id}"))
            assert batch.append(key=None, value=request.SerializeToString(), timestamp=None) is not None
        batch.close()
        sent = await (await producer.send_batch(batch, settings.requests_topic, partition=0))
    finally:
        await producer.stop()
    assert sent.offset == 0  # the test's premise: a fresh topic, offsets 0..TASKS-1
    return task_ids


async def run_batcher_until(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    times: int,
    finished: Callable[[], Awaitable[list[TaskStatus | None]]],
    wanted: Callable[[list[TaskStatus | None]], bool],
) -> SkippingFetches:
    """Run one batcher (the real ``serve``) whose fetches skip HIDDEN, until what
    ``finished`` reads is ``wanted`` (fails after 30 s, with what it read last)."""
    injected: list[SkippingFetches] = []
    real_make_consumer = batcher_main.make_consumer

    def make_consumer(*args: Any, **kwargs: Any) -> AIOKafkaConsumer:
        consumer = real_make_consumer(*args, **kwargs)
        injected.append(SkippingFetches(consumer, HIDDEN, times))
        return consumer

    monkeypatch.setattr(batcher_main, "make_consumer", make_consumer)
    stop = asyncio.Event()
    serving = asyncio.create_task(batcher_main.serve(settings, stop))
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 30
    try:
        while not wanted(seen := await finished()):
            if serving.done():
                serving.result()  # a batcher that stopped on its own: surface why
                pytest.fail("the batcher stopped before the tasks were finished")
            if loop.time() > give_up:
                pytest.fail(f"tasks not finished after 30 s: {[str(status) for status in seen]}")
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
    assert len(injected) == 1
    return injected[0]


async def statuses(store: TaskStore, task_ids: list[str]) -> list[TaskStatus | None]:
    records = [await store.get(task_id) for task_id in task_ids]
    return [record.status if record else None for record in records]


def rereads() -> float:
    """Gaps read again in partition 0, by the batchers run in this process."""
    return REGISTRY.get_sample_value("brimful_offset_gaps_reread_total", {"partition": "0"}) or 0.0


@pytest.fixture
async def gap_run(stack: EmbeddedStack) -> AsyncIterator[tuple[Settings, TaskStore]]:
    """Settings of this test's own, and the task store under its key prefix."""
    settings = gap_settings(stack)
    redis = Redis.from_url(settings.redis_url)
    try:
        keys = RedisKeys(settings.key_prefix)
        yield settings, TaskStore(redis, keys, settings.result_ttl_s, settings.task_wait_ttl_s)
    finally:
        await redis.aclose()


async def test_a_record_a_fetch_skipped_is_read_again_and_its_task_finishes(
    gap_run: tuple[Settings, TaskStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, store = gap_run
    task_ids = await fill(settings, store, skip_task=False)
    rereads_before = rereads()

    skipping = await run_batcher_until(
        settings,
        monkeypatch,
        times=1,
        finished=lambda: statuses(store, task_ids),
        wanted=lambda seen: all(status in (TaskStatus.DONE, TaskStatus.FAILED) for status in seen),
    )
    assert skipping.skipped == 1  # the fault happened
    assert rereads() > rereads_before
    for task_id in task_ids:
        record = await store.get(task_id)
        assert record is not None and record.status == TaskStatus.DONE, (task_id, record)
        assert record.outputs == expected_outputs(f"gap {task_id}")
    assert await committed_offset(settings, 0) == TASKS  # past the skipped record, now that it is done


async def test_a_gap_that_never_fills_holds_the_partition_only_for_its_patience(
    gap_run: tuple[Settings, TaskStore], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings, store = gap_run
    task_ids = await fill(settings, store, skip_task=True)
    others = [task_id for index, task_id in enumerate(task_ids) if index != HIDDEN]
    rereads_before = rereads()

    with caplog.at_level(logging.WARNING, logger="brimful.batcher"):
        skipping = await run_batcher_until(
            settings,
            monkeypatch,
            times=0,
            finished=lambda: statuses(store, others),
            wanted=lambda seen: all(status == TaskStatus.DONE for status in seen),
        )
    assert skipping.skipped >= 2  # read again, and skipped again, until the patience ran out
    assert rereads() - rereads_before >= 2
    gaps = [r for r in caplog.records if r.getMessage() == "offsets skipped: a real gap"]
    assert [getattr(r, "first_skipped", None) for r in gaps] == [HIDDEN]
    assert await store.get(task_ids[HIDDEN]) is None  # no task was ever recorded for it
    assert await committed_offset(settings, 0) == TASKS

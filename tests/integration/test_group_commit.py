"""Group commit on a real broker and a real Redis: submissions that arrive together share
one Redis round trip and one send, each is answered from its own outcome, and a failure
reaches only the submissions it concerns, leaving nothing of them behind."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from redis.exceptions import RedisError

from brimful.api.tasks.group_commit import (
    GroupCommitter,
    GroupCommitterStopped,
    SubmissionReceipts,
    longest_submission_s,
)
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.kafka import ensure_topics, make_producer
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings
from brimful.core.task_record import NewTask
from brimful.core.task_store import TaskStore
from brimful.stack import EmbeddedStack
from tests.helpers.frozen import frozen
from tests.helpers.pipeline import read_whole_topic
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings
from tests.helpers.unconfirmed import unconfirmed_ids


@pytest.fixture(scope="module")
def broker_and_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    # A short request timeout, so a frozen broker fails its sends within seconds.
    settings = stack_settings(kafka_request_timeout_ms=2000, kafka_fetch_lagging_max_wait_ms=1000)
    stack = EmbeddedStack(settings, tmp_path_factory.mktemp("group-commit"))
    try:
        stack.start_broker()
        stack.start_redis()
        yield stack
    finally:
        stack.stop()


@contextlib.asynccontextmanager
async def open_committer(
    settings: Settings, max_group: int = 256, min_gap_s: float = 0.0, max_unacknowledged: int = 0
) -> AsyncIterator[tuple[GroupCommitter, TaskStore]]:
    """A committer of its own Redis client and producer, to ``settings``'s requests topic;
    its confirmations are written when a test flushes its receipts."""
    await ensure_topics(settings)
    redis = make_redis(settings)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s, settings.task_wait_ttl_s)
    producer = make_producer(settings)
    await producer.start()
    receipts = SubmissionReceipts(store.unconfirmed, longest_submission_s(settings))
    group_commit = GroupCommitter(
        store,
        producer,
        settings.topic_generations_for(settings.model_name),
        max_group,
        max_waiting=10_000,
        min_gap_s=min_gap_s,
        receipts=receipts,
        max_unacknowledged=max_unacknowledged,
    )
    try:
        yield group_commit, store
    finally:
        await group_commit.close(drain_s=5)
        await producer.stop()
        await redis.aclose()


@pytest.fixture
async def committer(broker_and_redis: EmbeddedStack) -> AsyncIterator[tuple[GroupCommitter, TaskStore]]:
    async with open_committer(broker_and_redis.settings) as opened:
        yield opened


def new_tasks(count: int, tenant: str = "acme") -> list[NewTask]:
    return [NewTask(uuid.uuid4().hex, now_ms(), tenant) for _ in range(count)]


async def submit_all(group_commit: GroupCommitter, tasks: list[NewTask]) -> list[RecordMetadata | BaseException]:
    return await asyncio.gather(
        *(group_commit.submit(task, task.task_id.encode()) for task in tasks), return_exceptions=True
    )


async def ids_on_topic(stack: EmbeddedStack) -> set[str]:
    return {value.decode() for _, _, value in await read_whole_topic(stack.settings, stack.settings.requests_topic)}


def groups_committed() -> tuple[float, float]:
    """(groups, submissions) counted by the group-size histogram so far."""
    samples = {s.name: s.value for m in metrics.SUBMIT_GROUP_SIZE.collect() for s in m.samples}
    return samples["brimful_submit_group_size_count"], samples["brimful_submit_group_size_sum"]


async def test_submissions_that_arrive_together_are_written_as_one_group(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, store = committer
    groups_before, submissions_before = groups_committed()
    tasks = new_tasks(200)
    answers = await submit_all(group_commit, tasks)
    groups, submissions = groups_committed()
    assert submissions - submissions_before == 200
    assert groups - groups_before <= 2, "200 submissions that arrived together took more than two groups"
    assert all(isinstance(answer, RecordMetadata) for answer in answers), answers[:3]
    # Each answer is its own record's place on the topic, and each task is recorded.
    assert len({(a.partition, a.offset) for a in answers}) == 200  # type: ignore[union-attr]
    for task in tasks[:20]:
        record = await store.get(task.task_id)
        assert record is not None and record.status.value == "queued" and record.tenant == "acme"
    assert {t.task_id for t in tasks} <= await ids_on_topic(broker_and_redis)
    # Each was unconfirmed from its record on, until the broker's answers were written back.
    ids = {t.task_id for t in tasks}
    assert ids <= await unconfirmed_ids(store)
    receipts = group_commit.receipts
    assert receipts.pending >= 200
    await receipts.flush()
    assert not ids & await unconfirmed_ids(store)


async def test_groups_sent_while_a_request_is_out_join_its_partition_and_the_next_request_turns(
    broker_and_redis: EmbeddedStack,
) -> None:
    # Three partitions and groups of five: the groups formed while one produce request is
    # out must gather in one partition (one record batch), not one partition each.
    settings = broker_and_redis.settings.model_copy(
        update={"requests_topic": f"sticky-{uuid.uuid4().hex[:8]}", "topic_partitions": 3}
    )
    broker_pid = broker_and_redis.processes["broker"].pid
    assert broker_pid is not None
    async with open_committer(settings, max_group=5) as (group_commit, store):
        (first,) = await submit_all(group_commit, new_tasks(1))  # nothing is out after it
        assert isinstance(first, RecordMetadata)
        held = new_tasks(30)
        async with frozen(broker_pid):  # the next request stays out while the rest are sent
            under_way = asyncio.gather(
                *(group_commit.submit(t, t.task_id.encode()) for t in held), return_exceptions=True
            )

            async def all_recorded() -> bool:
                return all([await store.get(t.task_id) is not None for t in held])

            await wait_for(all_recorded, 10, "six groups to be recorded")
        answers = await under_way
        assert all(isinstance(answer, RecordMetadata) for answer in answers), answers[:3]
        partitions = {answer.partition for answer in answers}  # type: ignore[union-attr]
        assert len(partitions) == 1, f"six groups sent while one request was out went to {sorted(partitions)}"
        (after,) = await submit_all(group_commit, new_tasks(1))
        assert isinstance(after, RecordMetadata)
        assert after.partition == (partitions.pop() + 1) % 3, "the partition did not turn once the request came back"


async def test_with_a_gap_a_lone_submission_goes_at_once_and_those_within_it_join_one_group(
    broker_and_redis: EmbeddedStack,
) -> None:
    gap_s = 3.0
    async with open_committer(broker_and_redis.settings, min_gap_s=gap_s) as (group_commit, _store):
        loop = asyncio.get_running_loop()
        groups_before, _ = groups_committed()
        began = loop.time()
        (lone,) = await submit_all(group_commit, new_tasks(1))
        lone_s = loop.time() - began
        assert isinstance(lone, RecordMetadata)
        assert lone_s < gap_s / 2, f"a lone submission on a quiet committer took {lone_s:.2f} s"
        # Five more, spread out as an open loop's arrivals are: within the gap, so one group.
        spread: list[asyncio.Task[RecordMetadata]] = []
        for task in new_tasks(5):
            spread.append(asyncio.create_task(group_commit.submit(task, task.task_id.encode())))
            await asyncio.sleep(0.05)
        answers = await asyncio.gather(*spread)
        groups, _ = groups_committed()
    assert all(isinstance(answer, RecordMetadata) for answer in answers)
    assert groups - groups_before == 2, "the spread submissions did not join one group"


async def test_while_a_group_is_out_unanswered_the_next_waits_and_gathers_the_arrivals(
    broker_and_redis: EmbeddedStack,
) -> None:
    broker_pid = broker_and_redis.processes["broker"].pid
    assert broker_pid is not None
    async with open_committer(broker_and_redis.settings, max_unacknowledged=1) as (group_commit, store):
        groups_before, _ = groups_committed()
        (first,) = new_tasks(1)
        spread: list[asyncio.Task[RecordMetadata]] = []
        async with frozen(broker_pid):  # the first group's records stay out unanswered
            out = asyncio.create_task(group_commit.submit(first, first.task_id.encode()))

            async def first_recorded() -> bool:
                return await store.get(first.task_id) is not None

            await wait_for(first_recorded, 10, "the first group to be recorded")
            held = new_tasks(12)
            for task in held:  # spread out, as an open loop's arrivals are
                spread.append(asyncio.create_task(group_commit.submit(task, task.task_id.encode())))
                await asyncio.sleep(0.02)
            # Not a group each, and no timer: they wait for the broker's answer to the first.
            assert [await store.get(t.task_id) for t in held] == [None] * len(held)
        answers = await asyncio.gather(out, *spread)
        groups, _ = groups_committed()
        assert all(isinstance(answer, RecordMetadata) for answer in answers), answers[:3]
        assert groups - groups_before == 2, "the arrivals while a group was out did not join one group"
        for task in [first, *held]:
            record = await store.get(task.task_id)
            assert record is not None and record.status.value == "queued"


async def test_a_redis_error_of_some_submissions_fails_only_them_and_leaves_nothing(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, store = committer
    settings = broker_and_redis.settings
    keys = RedisKeys(settings.key_prefix)
    redis = make_redis(settings)
    try:
        # This tenant's in-flight set holds the wrong type: its admission script fails.
        await redis.set(keys.in_flight("poisoned"), "not a sorted set")
        good, poisoned = new_tasks(10), new_tasks(10, tenant="poisoned")
        mixed = [task for pair in zip(good, poisoned) for task in pair]  # one group, interleaved
        answers = dict(zip((t.task_id for t in mixed), await submit_all(group_commit, mixed)))
    finally:
        await redis.delete(keys.in_flight("poisoned"))
        await redis.aclose()
    assert all(isinstance(answers[t.task_id], RecordMetadata) for t in good)
    assert all(isinstance(answers[t.task_id], RedisError) for t in poisoned)
    assert "WRONGTYPE" in str(answers[poisoned[0].task_id])
    for task in poisoned:
        assert await store.get(task.task_id) is None  # its half-written record was taken back
    assert not {t.task_id for t in poisoned} & await unconfirmed_ids(store)
    on_topic = await ids_on_topic(broker_and_redis)
    assert {t.task_id for t in good} <= on_topic
    assert not {t.task_id for t in poisoned} & on_topic  # never sent


async def test_redis_down_fails_the_group_and_the_next_group_goes_through(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, _store = committer
    broker_and_redis.processes["redis"].stop()
    try:
        lost = new_tasks(10)
        answers = await submit_all(group_commit, lost)
        assert all(isinstance(answer, RedisError) for answer in answers), answers[:3]
    finally:
        broker_and_redis.restart("redis")
    after = new_tasks(10)
    assert all(isinstance(answer, RecordMetadata) for answer in await submit_all(group_commit, after))
    assert not {t.task_id for t in lost} & await ids_on_topic(broker_and_redis)


async def test_a_broker_that_stops_answering_fails_only_the_group_it_holds(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, store = committer
    before = new_tasks(20)
    assert all(isinstance(answer, RecordMetadata) for answer in await submit_all(group_commit, before))
    broker_pid = broker_and_redis.processes["broker"].pid
    assert broker_pid is not None
    held = new_tasks(20)
    async with frozen(broker_pid):  # it takes no send and refuses none
        answers = await submit_all(group_commit, held)
    assert all(isinstance(answer, KafkaError) for answer in answers), answers[:3]
    for task in held:
        # Taken back before the caller heard of it: should the broker still append the
        # record, no batcher runs a task that is not recorded, and a retry is a new task.
        assert await store.get(task.task_id) is None
    assert not {t.task_id for t in held} & await unconfirmed_ids(store)
    after = new_tasks(20)
    assert all(isinstance(answer, RecordMetadata) for answer in await submit_all(group_commit, after))
    on_topic = await ids_on_topic(broker_and_redis)
    assert {t.task_id for t in before + after} <= on_topic  # nothing acknowledged is lost
    for task in before + after:
        record = await store.get(task.task_id)
        assert record is not None and record.status.value == "queued"


async def test_a_caller_that_goes_away_leaves_its_submission_to_finish(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, store = committer
    (task,) = new_tasks(1)
    caller = asyncio.create_task(group_commit.submit(task, task.task_id.encode()))
    await asyncio.sleep(0)  # the submission is queued for its group
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller

    # The group still writes it, whole: recorded and on the topic, never half-done.
    async def on_topic() -> bool:
        return task.task_id in await ids_on_topic(broker_and_redis)

    for _ in range(50):
        if await on_topic():
            break
        await asyncio.sleep(0.1)
    record = await store.get(task.task_id)
    assert record is not None and record.status.value == "queued"
    assert await on_topic()


async def test_closing_lets_the_submissions_under_way_finish_and_refuses_new_ones(
    committer: tuple[GroupCommitter, TaskStore],
) -> None:
    group_commit, store = committer
    tasks = new_tasks(50)
    under_way = asyncio.gather(*(group_commit.submit(t, t.task_id.encode()) for t in tasks), return_exceptions=True)
    await asyncio.sleep(0)  # they are waiting for their group
    await group_commit.close(drain_s=10)
    assert all(isinstance(answer, RecordMetadata) for answer in await under_way)
    (late,) = new_tasks(1)
    with pytest.raises(GroupCommitterStopped):
        await group_commit.submit(late, b"late")
    assert await store.get(late.task_id) is None


async def test_a_stop_that_cuts_submissions_short_withdraws_what_it_recorded(
    broker_and_redis: EmbeddedStack, committer: tuple[GroupCommitter, TaskStore]
) -> None:
    group_commit, store = committer
    broker_pid = broker_and_redis.processes["broker"].pid
    assert broker_pid is not None
    tasks = new_tasks(10, tenant="stopped")
    async with frozen(broker_pid):  # the sends hang: recorded, never acknowledged
        under_way = asyncio.gather(*(group_commit.submit(t, t.task_id.encode()) for t in tasks), return_exceptions=True)

        async def recorded() -> bool:
            return all([await store.get(t.task_id) is not None for t in tasks])

        await wait_for(recorded, 10, "the group to be recorded")
        await group_commit.close(drain_s=0.5)
        answers = await under_way
    assert all(isinstance(answer, GroupCommitterStopped) for answer in answers), answers[:3]
    redis = store._redis
    for task in tasks:  # told "not accepted": neither queued for days nor run if the record landed
        assert await store.get(task.task_id) is None
        assert await redis.get(store.keys.tombstone(task.task_id)) == b"withdrawn"
    assert await redis.zcard(store.keys.in_flight("stopped")) == 0
    assert not {t.task_id for t in tasks} & await unconfirmed_ids(store)

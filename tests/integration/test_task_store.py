"""Task state transitions against a real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from brimful.core.clock import now_ms
from brimful.core.redis_keys import RedisKeys
from brimful.core.stats import SharedStats, StatsField
from brimful.core.task_record import FINISHED_MESSAGE_LUA, FinishedMessage, KnownTask, NewTask, TaskStatus
from brimful.core.task_store import TaskStore
from brimful.core.tenant_limits import TenantLimits, TenantLimitStore
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.redis_sends import SendCounter
from tests.helpers.unconfirmed import check_stale_entries_give_their_quota_back, unconfirmed_ids


@pytest.fixture
async def store(stack: EmbeddedStack) -> AsyncIterator[TaskStore]:
    redis = Redis.from_url(stack.settings.redis_url)
    # A prefix of its own, so this test's keys and counters touch nothing else.
    yield TaskStore(redis, RedisKeys(f"store-test-{uuid.uuid4().hex[:8]}"), ttl_s=60, waiting_ttl_s=60)
    await redis.aclose()


async def test_queued_task_moves_to_running_then_done(store: TaskStore) -> None:
    task_id = uuid.uuid4().hex
    await store.create_queued(task_id, now_ms())
    assert (await store.get(task_id)).status is TaskStatus.QUEUED  # type: ignore[union-attr]
    assert await store.mark_running([task_id]) == [task_id]
    assert (await store.get(task_id)).status is TaskStatus.RUNNING  # type: ignore[union-attr]
    assert await store.mark_done({task_id: {"Y": 1}}) == 1
    record = await store.get(task_id)
    assert record is not None and record.status is TaskStatus.DONE and record.outputs == {"Y": 1}


async def test_first_result_wins_and_done_is_never_reopened(store: TaskStore) -> None:
    task_id = uuid.uuid4().hex
    await store.create_queued(task_id, now_ms())
    assert await store.mark_done({task_id: {"Y": "first"}}) == 1
    assert await store.mark_done({task_id: {"Y": "second"}}) == 0
    assert await store.mark_running([task_id]) == []
    assert await store.mark_failed([task_id], {"class": "x"}) == 0
    record = await store.get(task_id)
    assert record is not None and record.status is TaskStatus.DONE and record.outputs == {"Y": "first"}
    assert record.status.is_final and await store.get(uuid.uuid4().hex) is None


async def test_failed_is_final_too(store: TaskStore) -> None:
    task_id = uuid.uuid4().hex
    await store.create_queued(task_id, now_ms())
    assert await store.mark_failed([task_id], {"class": "model_error", "message": "boom"}) == 1
    assert await store.mark_done({task_id: {"Y": 1}}) == 0
    record = await store.get(task_id)
    assert record is not None and record.status is TaskStatus.FAILED
    assert record.error == {"class": "model_error", "message": "boom"}


async def test_records_expire_after_the_ttl(stack: EmbeddedStack, store: TaskStore) -> None:
    task_id = uuid.uuid4().hex
    await store.create_queued(task_id, now_ms())
    await store.mark_done({task_id: {"Y": 1}})
    redis = Redis.from_url(stack.settings.redis_url)
    try:
        ttl = await redis.ttl(store.keys.task(task_id))
    finally:
        await redis.aclose()
    assert 0 < ttl <= 60


async def test_stats_add_up_and_start_at_zero(stack: EmbeddedStack) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    shared = SharedStats(redis, RedisKeys(f"stats-test-{uuid.uuid4().hex[:8]}"))
    try:
        assert set((await shared.read()).values()) == {0}
        await shared.add({StatsField.BATCHES_DISPATCHED: 2, StatsField.ROWS_DISPATCHED: 100})
        await shared.add({StatsField.BATCHES_DISPATCHED: 1, StatsField.ROWS_DISPATCHED: 64})
        stats = await shared.read()
    finally:
        await redis.aclose()
    assert stats[StatsField.BATCHES_DISPATCHED] == 3
    assert stats[StatsField.ROWS_DISPATCHED] == 164


async def test_forget_removes_a_task(store: TaskStore) -> None:
    task_id = uuid.uuid4().hex
    await store.create_queued(task_id, now_ms())
    await store.forget(task_id)
    assert await store.get(task_id) is None


async def test_cancel_wins_only_while_queued_and_keeps_the_task_from_running(store: TaskStore) -> None:
    queued, running = uuid.uuid4().hex, uuid.uuid4().hex
    for task_id in (queued, running):
        await store.create_queued(task_id, now_ms())
    assert await store.mark_running([running]) == [running]
    assert await store.cancel(queued)
    assert not await store.cancel(running)
    assert await store.mark_running([queued, running]) == [running]  # a cancelled task never runs
    assert (await store.get(queued)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    assert await store.mark_done({queued: {"Y": 1}}) == 0


@pytest.fixture
async def finished_feed(stack: EmbeddedStack, store: TaskStore) -> AsyncIterator[tuple[Redis, PubSub]]:
    """A client subscribed to the store's finished channel, its confirmation read."""
    redis = Redis.from_url(stack.settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(store.keys.finished_channel)
    try:
        assert (await pubsub.get_message(timeout=2))["type"] == "subscribe"  # type: ignore[index]
        yield redis, pubsub
    finally:
        await pubsub.aclose()
        await redis.aclose()


async def test_final_states_are_published_as_they_happen(store: TaskStore, finished_feed: tuple[Redis, PubSub]) -> None:
    _, pubsub = finished_feed
    done, failed = uuid.uuid4().hex, uuid.uuid4().hex
    for task_id in (done, failed):
        await store.create_queued(task_id, now_ms())
    await store.mark_done({done: {"Y": 1}})
    await store.mark_failed([failed], {"class": "x"})
    await store.mark_done({done: {"Y": 2}})  # not a change: not published again
    batch = [uuid.uuid4().hex for _ in range(3)]
    for task_id in batch:
        await store.create_queued(task_id, now_ms())
    await store.mark_done({task_id: {"Y": [n, "a\nb\x1ec"]} for n, task_id in enumerate(batch)})
    messages = []
    while (message := await pubsub.get_message(timeout=1)) is not None:
        messages.append([FinishedMessage.record(entry) for entry in FinishedMessage.entries(message["data"])])
    # One message a step: the batch's three tasks share one.
    assert [[record.task_id for record in records] for records in messages] == [[done], [failed], batch]
    published = [record for records in messages for record in records]
    # Each entry is the whole final record, equal to what a read of the store gives,
    # even with newlines and the separator itself inside an output.
    assert published == [await store.get(task_id) for task_id in (done, failed, *batch)]
    assert published[0].outputs == {"Y": 1} and published[1].error == {"class": "x"}
    assert published[4].outputs == {"Y": [2, "a\nb\x1ec"]}


async def test_a_task_keeps_its_model_through_every_move_and_in_what_is_published(
    store: TaskStore, finished_feed: tuple[Redis, PubSub]
) -> None:
    redis, pubsub = finished_feed
    small, large = uuid.uuid4().hex, uuid.uuid4().hex
    assert await store.create_queued_many(
        [NewTask(small, now_ms(), "acme", 0, "model_16"), NewTask(large, now_ms(), "acme", 0, "model_64")]
    ) == [None, None]
    assert sorted(await store.mark_running([small, large])) == sorted([small, large])
    assert (await store.get(small)).model == "model_16"  # type: ignore[union-attr]
    await store.mark_done({small: {"Y": 1}, large: {"Y": 2}})
    message = await pubsub.get_message(timeout=2)
    assert message is not None
    records = [FinishedMessage.record(entry) for entry in FinishedMessage.entries(message["data"])]
    published = {record.task_id: record.model for record in records}
    assert published == {small: "model_16", large: "model_64"}
    assert (await store.get(large)).model == "model_64"  # type: ignore[union-attr]
    await redis.delete(store.keys.task(large))  # expired before an on-call replay recreates it
    await store.requeue(large, now_ms(), "acme", "model_64")
    assert (await store.get(large)).model == "model_64"  # type: ignore[union-attr]


async def test_a_task_counts_in_flight_for_its_tenant_until_final_and_again_when_replayed(
    stack: EmbeddedStack, store: TaskStore
) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    limits = TenantLimitStore(redis, store.keys, TenantLimits(0, 3))
    done, failed, cancelled, refused = (uuid.uuid4().hex for _ in range(4))
    for task_id in (done, failed, cancelled):
        assert await store.create_queued(task_id, now_ms(), "t1", max_in_flight=3) is None
    assert await store.create_queued(refused, now_ms(), "t1", max_in_flight=3) == 3  # all three slots taken
    assert await store.get(refused) is None  # a refused task is not recorded
    assert await store.create_queued(refused, now_ms(), "t2", max_in_flight=3) is None  # another tenant's count
    await store.mark_running([done])
    assert await limits.in_flight("t1") == 3  # running is still in flight
    await store.mark_done({done: {"Y": 1}})
    await store.mark_failed([failed], {"class": "model_error"})
    assert await store.cancel(cancelled)
    assert await limits.in_flight("t1") == 0
    await store.requeue(failed, now_ms(), "t1")  # an on-call replay counts again
    assert await limits.in_flight("t1") == 1
    await store.forget(refused, "t2")  # an enqueue that failed gives its slot back
    assert await limits.in_flight("t2") == 0
    # Entries older than an unfinished task's retention (60 s here) are dropped: a lost task
    # cannot hold a slot forever.
    assert await store.create_queued(uuid.uuid4().hex, now_ms() + 120_000, "t1", max_in_flight=1) is None
    await redis.aclose()


async def test_requests_that_find_a_tenants_limits_stale_share_one_read(
    stack: EmbeddedStack, store: TaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    limits = TenantLimitStore(redis, store.keys, TenantLimits(0, 3))
    try:
        await limits.set("t1", max_in_flight=7)
        sends = SendCounter(redis, monkeypatch).start()
        answers = await asyncio.gather(*(limits.get("t1") for _ in range(50)))  # the cache is empty: one read
        assert sends.stop() == 1
        assert answers == [TenantLimits(0, 7)] * 50
        assert await limits.get("t1") == TenantLimits(0, 7)  # fresh now: no read at all
    finally:
        await redis.delete(store.keys.tenant_limits)
        await redis.aclose()


async def test_an_idempotency_key_names_a_task_only_once_it_was_accepted(store: TaskStore) -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    assert await store.idempotency.claim("k", first) is None
    held = await store.idempotency.claim("k", second)
    assert held is not None and held.task_id == first and held.pending  # under way: not yet a task to name
    await store.idempotency.release("k", second)  # another submission's release frees nothing
    assert (await store.idempotency.claim("k", second)).pending  # type: ignore[union-attr]
    await store.idempotency.release("k", first)  # the first was refused: the key is free again
    assert await store.idempotency.claim("k", second) is None
    assert await store.idempotency.commit("k", second)
    held = await store.idempotency.claim("k", first)
    assert held is not None and held.task_id == second and not held.pending
    assert not await store.idempotency.commit("k", first)  # only the claim's owner binds it


async def test_an_idempotency_key_lives_as_long_as_its_task_waits_then_as_its_result(stack: EmbeddedStack) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    store = TaskStore(redis, RedisKeys(f"idem-test-{uuid.uuid4().hex[:8]}"), ttl_s=60, waiting_ttl_s=600)
    try:
        task_id = uuid.uuid4().hex
        assert await store.idempotency.claim("t1/order-7", task_id) is None
        assert 60 < await redis.ttl(store.keys.idempotency("t1/order-7")) <= 600  # a claim outlives a stop too
        (outcome,) = await store.create_queued_many([NewTask(task_id, now_ms(), "t1", 0, "m", "t1/order-7")])
        assert outcome is None and await store.idempotency.commit("t1/order-7", task_id)
        # Accepted, and waiting in a backlog maybe past the result retention: the key waits with it.
        assert 60 < await redis.ttl(store.keys.idempotency("t1/order-7")) <= 600
        await store.mark_running([task_id])
        assert await store.mark_done({task_id: {"Y": 1}}) == 1
        assert 0 < await redis.ttl(store.keys.idempotency("t1/order-7")) <= 60  # final: as long as its result
        held = await store.idempotency.claim("t1/order-7", uuid.uuid4().hex)
        assert held is not None and held.task_id == task_id and not held.pending
    finally:
        await redis.aclose()


async def test_an_unfinished_task_outlives_the_result_retention_and_a_cancelled_one_is_never_recreated(
    stack: EmbeddedStack,
) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    store = TaskStore(redis, RedisKeys(f"wait-test-{uuid.uuid4().hex[:8]}"), ttl_s=60, waiting_ttl_s=600)
    try:
        waiting, cancelled = uuid.uuid4().hex, uuid.uuid4().hex
        await store.create_queued(waiting, now_ms(), "t1")
        assert 60 < await redis.ttl(store.keys.task(waiting)) <= 600  # it may wait in Kafka past the hour
        await store.mark_running([waiting])
        assert 60 < await redis.ttl(store.keys.task(waiting)) <= 600
        await store.mark_done({waiting: {"Y": 1}})
        assert 0 < await redis.ttl(store.keys.task(waiting)) <= 60  # final: kept for the result retention

        await store.create_queued(cancelled, now_ms(), "t1")
        assert await store.cancel(cancelled)
        await redis.delete(store.keys.task(cancelled))  # as its expiry would, long before it is consumed
        assert await store.mark_running([cancelled]) == []  # so it never runs
        assert await store.recreate_missing([KnownTask(cancelled, now_ms(), "t1", "m")]) == []  # its tombstone
        assert await store.mark_done({cancelled: {"Y": 1}}) == 0
        assert await store.get(cancelled) is None
        assert 60 < await redis.ttl(store.keys.tombstone(cancelled)) <= 600
    finally:
        await redis.aclose()


async def test_a_task_whose_record_was_lost_is_recreated_running_unless_withdrawn(store: TaskStore) -> None:
    lost, withdrawn, done = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    for task_id in (lost, withdrawn, done):
        await store.create_queued(task_id, 1000, "t1", model="m")
    await store.mark_done({done: {"Y": 1}})
    await store.forget(lost, "t1")  # as a Redis that restarted empty would
    await store.withdraw_many([(withdrawn, "t1")])  # its client was told it was not accepted
    assert await store.get(withdrawn) is None
    known = [KnownTask(task_id, 1000, "t1", "m") for task_id in (lost, withdrawn, done)]
    assert await store.recreate_missing(known) == [lost]
    record = await store.get(lost)
    assert record is not None and record.status is TaskStatus.RUNNING
    assert (record.submitted_at_ms, record.tenant, record.model) == (1000, "t1", "m")
    assert await store.recreate_missing(known) == []  # its record exists now
    assert await store.mark_done({lost: {"Y": 2}}) == 1
    assert (await store.get(done)).outputs == {"Y": 1}  # type: ignore[union-attr]


async def test_a_batch_costs_two_round_trips_and_its_counters_ride_with_its_results(
    stack: EmbeddedStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    keys = RedisKeys(f"store-test-{uuid.uuid4().hex[:8]}")
    store, stats = TaskStore(redis, keys, ttl_s=60, waiting_ttl_s=60), SharedStats(redis, keys)
    try:
        ids = [uuid.uuid4().hex for _ in range(64)]
        for task_id in ids:
            await store.create_queued(task_id, now_ms())
        await store.mark_running(ids[:1])  # the scripts are loaded once, before counting
        await store.mark_done({ids[0]: {"Y": 0}}, {StatsField.ROWS_DISPATCHED: 1}, StatsField.TASKS_DONE)
        spy = SendCounter(redis, monkeypatch).start()
        running = await store.mark_running(ids[1:])
        counters = {
            StatsField.BATCHES_DISPATCHED: 1,
            StatsField.ROWS_DISPATCHED: 63,
            StatsField.PADDED_SLOTS: 1,
            StatsField.flushes("full"): 1,
        }
        # Each task's provenance rides in the same step as its outputs: no round trip more.
        provenance = {t: b'{"arrived_us":%d,"batch_id":"b"}' % n for n, t in enumerate(running)}
        done = await store.mark_done(
            {t: {"Y": 1} for t in running}, counters, StatsField.TASKS_DONE, provenance=provenance
        )
        assert spy.stop() == 2 and done == 63
        records = await store.get_many(running)
        assert all(r is not None and r.provenance == orjson.loads(provenance[r.task_id]) for r in records)
        totals = await stats.read()
        assert totals[StatsField.TASKS_DONE] == 64 and totals[StatsField.ROWS_DISPATCHED] == 64
        assert totals[StatsField.BATCHES_DISPATCHED] == 1 and totals[StatsField.flushes("full")] == 1
        # A redelivered batch moves nothing: its counters still count, its tasks not again.
        assert (
            await store.mark_done(
                {t: {"Y": 2} for t in running}, {StatsField.BATCHES_DISPATCHED: 1}, StatsField.TASKS_DONE
            )
            == 0
        )
        totals = await stats.read()
        assert totals[StatsField.TASKS_DONE] == 64 and totals[StatsField.BATCHES_DISPATCHED] == 2
    finally:
        await redis.aclose()


async def test_a_group_is_recorded_in_one_round_trip_each_task_on_its_own(
    stack: EmbeddedStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = Redis.from_url(stack.settings.redis_url)
    keys = RedisKeys(f"store-test-{uuid.uuid4().hex[:8]}")
    store = TaskStore(redis, keys, ttl_s=60, waiting_ttl_s=60)
    try:
        now = now_ms()
        for _ in range(2):  # the tenant "full" holds its limit of two already
            assert await store.create_queued(uuid.uuid4().hex, now, "full", max_in_flight=2) is None
        ok = [NewTask(uuid.uuid4().hex, now, "ok", 0) for _ in range(40)]
        refused = NewTask(uuid.uuid4().hex, now, "full", 2)
        clashing = NewTask(uuid.uuid4().hex, now, "ok", 0)
        await redis.rpush(keys.task(clashing.task_id), "a list where the record would go")
        group = [*ok[:20], refused, clashing, *ok[20:]]
        spy = SendCounter(redis, monkeypatch).start()
        outcomes = await store.create_queued_many(group)
        assert spy.stop() == 1  # the script was loaded by the creates above
        assert outcomes[:20] == [None] * 20 and outcomes[22:] == [None] * 20
        assert outcomes[20] == 2  # refused: the tenant's count
        assert "WRONGTYPE" in str(outcomes[21])
        in_flight = {member.decode() for member in await redis.zrange(keys.in_flight("ok"), 0, -1)}
        assert in_flight == {task.task_id for task in ok}  # the failed task's entry was taken back
        assert await store.get(refused.task_id) is None
        assert await redis.zscore(keys.in_flight("full"), refused.task_id) is None
        records = [await store.get(task.task_id) for task in ok]
        assert all(r is not None and r.status is TaskStatus.QUEUED and r.tenant == "ok" for r in records)
    finally:
        await redis.aclose()


async def test_the_finished_message_written_in_lua_reads_back_whole_in_python(stack: EmbeddedStack) -> None:
    # The encoder runs in the real Redis, on values with every character the format leans
    # on: escaped newlines and control characters inside the JSON, non-ASCII text.
    redis = Redis.from_url(stack.settings.redis_url)
    outputs = {"TEXT": 'a\nb\t"c"\x1e ñ 漢字', "LENGTH": [3]}
    channel = f"finished-test-{uuid.uuid4().hex}"
    pubsub = redis.pubsub()
    await pubsub.subscribe(channel)
    try:
        script = (
            FINISHED_MESSAGE_LUA
            + "publish_finished(KEYS[1], {finished_entry(unpack(ARGV, 1, 9)), finished_entry(unpack(ARGV, 10, 18))})"
        )
        provenance = orjson.dumps({"batch_id": "b1", "flush_reason": "full", "rows": 64})
        done = ["t1", "done", "100", "130", "acme", "brimful_reference", provenance, "outputs", orjson.dumps(outputs)]
        failed = ["t2", "failed", "101", "131", "globex", "m", "", "error", orjson.dumps({"class": "model_error"})]
        await redis.eval(script, 1, channel, *done, *failed)

        payloads: list[bytes] = []

        async def heard() -> bool:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                payloads.append(message["data"])
            return bool(payloads)

        await wait_for(heard, 5, "the finished message")
        entries = FinishedMessage.entries(payloads[0])
        assert [FinishedMessage.task_id(entry) for entry in entries] == ["t1", "t2"]
        first, second = (FinishedMessage.record(entry) for entry in entries)
        assert (first.status, first.outputs, first.tenant, first.model, first.updated_at_ms) == (
            TaskStatus.DONE,
            outputs,
            "acme",
            "brimful_reference",
            130,
        )
        assert first.provenance == orjson.loads(provenance) and second.provenance is None
        assert (second.status, second.error, second.outputs, second.submitted_at_ms) == (
            TaskStatus.FAILED,
            {"class": "model_error"},
            None,
            101,
        )
    finally:
        await pubsub.aclose()
        await redis.aclose()


async def test_tasks_recorded_and_never_confirmed_give_their_quota_back_when_stale(store: TaskStore) -> None:
    await check_stale_entries_give_their_quota_back(store)


async def test_a_group_larger_than_one_zadd_is_noted_whole_among_the_unconfirmed(store: TaskStore) -> None:
    # 600 tasks: 1,200 values, past the 1,000 the admission script hands one ZADD.
    tasks = [NewTask(uuid.uuid4().hex, now_ms(), "big") for _ in range(600)]
    assert await store.create_queued_many(tasks) == [None] * 600
    assert {task.task_id for task in tasks} <= await unconfirmed_ids(store)

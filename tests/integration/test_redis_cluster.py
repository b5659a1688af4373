"""Brimful on a real Redis Cluster: three masters on loopback, formed by the embedded stack.

The cluster refuses any command or script whose keys span hash slots (CROSSSLOT), so each
test here fails if a store touches two slots at once; and the keys are checked to really
spread over the masters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from aiokafka import AIOKafkaProducer
from redis.asyncio.cluster import RedisCluster

from brimful.core.clock import now_ms
from brimful.core.redis_client import follow_channel
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import Field, FinishedMessage, TaskStatus
from brimful.core.task_store import TaskStore
from brimful.schemas import InputTensor, TaskRequest
from brimful.stack import EmbeddedStack
from brimful.stack.embedded import REDIS_CLUSTER_MASTERS
from brimful.stack.processes import wait_until
from tests.helpers.live_policy import policy_seen_by_batchers, tune_live
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient
from tests.helpers.unconfirmed import check_stale_entries_give_their_quota_back


@pytest.fixture(scope="module")
def cluster_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    workdir: Path = tmp_path_factory.mktemp("cluster-stack")
    settings = stack_settings(redis_cluster=True, topic_partitions=2, batcher_metrics_port=0)
    running = start_stack(workdir, settings)
    try:
        second = running.start_batcher()  # two on the status board: their keys are read back together
        keys = RedisKeys(settings.key_prefix)

        def both_on_the_board() -> bool:
            with redis.RedisCluster.from_url(settings.redis_url) as client:
                members = client.smembers(keys.batcher_members)
                return sum(1 for m in members if client.get(keys.batcher_status(m.decode()))) == 2

        wait_until(both_on_the_board, 60, "second batcher on the status board", second)
        yield running
    finally:
        running.stop()


@pytest.fixture
async def cluster_client(cluster_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(cluster_stack.api_url) as client:
        yield client


@pytest.fixture
async def store(cluster_stack: EmbeddedStack) -> AsyncIterator[TaskStore]:
    client = RedisCluster.from_url(cluster_stack.settings.redis_url)
    # A prefix of its own, so these keys touch nothing the pipeline tests count.
    yield TaskStore(client, RedisKeys(f"cluster-test-{uuid.uuid4().hex[:8]}"), ttl_s=60, waiting_ttl_s=60)
    await client.aclose()


def keys_per_master(stack: EmbeddedStack, pattern: str) -> list[int]:
    """How many keys matching ``pattern`` each master holds, asked of each node itself."""
    counts = []
    masters = [name for name in stack.processes if name.startswith("redis")]
    assert len(masters) == REDIS_CLUSTER_MASTERS
    for name in masters:
        port = int(stack.processes[name].argv[stack.processes[name].argv.index("--port") + 1])
        with redis.Redis(port=port) as node:
            counts.append(sum(1 for _ in node.scan_iter(match=pattern, count=1000)))
    return counts


async def test_tasks_run_end_to_end_with_their_records_spread_over_every_master(
    cluster_stack: EmbeddedStack, cluster_client: TaskClient
) -> None:
    texts = [f"cluster-{i}-{uuid.uuid4().hex[:6]}" for i in range(300)]
    answers = await asyncio.gather(
        *(cluster_client.request("POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": t}}) for t in texts)
    )
    for text, (status, body) in zip(texts, answers):
        assert status == 200, body  # answered by the long-poll: woken through the cluster's pub/sub
        assert body["status"] == "done" and body["outputs"] == expected_outputs(text)
    per_master = keys_per_master(cluster_stack, f"{cluster_stack.settings.key_prefix}:task:*")
    assert sum(per_master) >= len(texts) and min(per_master) > 0, per_master


async def test_a_live_policy_change_reaches_every_batcher(cluster_client: TaskClient) -> None:
    # A watched transaction over the policy and its history, then each batcher's status
    # read back with one MGET: both need their keys in one slot.
    await tune_live(cluster_client, max_wait_ms=180)
    assert {params["max_wait"] for params in await policy_seen_by_batchers(cluster_client)} == {0.18}
    status, body = await cluster_client.request("GET", "/v1/admin/policy")
    assert status == 200 and body["history"][0]["new"]["max_wait_ms"] == 180, body
    assert len(await policy_seen_by_batchers(cluster_client)) == 2


async def test_cancel_and_idempotency_key(cluster_stack: EmbeddedStack, cluster_client: TaskClient) -> None:
    headers = {"Idempotency-Key": f"cluster-{uuid.uuid4().hex}"}
    first = await cluster_client.request(
        "POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": "once"}}, headers=headers
    )
    again = await cluster_client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "once"}}, headers=headers)
    assert first[0] == 200 and again[1]["task_id"] == first[1]["task_id"], (first, again)
    status, body = await cluster_client.request("DELETE", f"/v1/tasks/{first[1]['task_id']}")
    assert status == 409, body  # done already: a cancel cannot undo it


async def test_a_batch_spanning_many_slots_moves_and_publishes_every_task(
    cluster_stack: EmbeddedStack, store: TaskStore
) -> None:
    ids = [uuid.uuid4().hex for _ in range(64)]
    probe = "probe"
    heard: list[str] = []
    probe_heard, all_heard = asyncio.Event(), asyncio.Event()

    def on_message(payload: bytes) -> None:
        heard.extend(FinishedMessage.task_id(entry) for entry in FinishedMessage.entries(payload))
        if probe in heard:
            probe_heard.set()
        if set(ids) <= set(heard):
            all_heard.set()

    subscriber = RedisCluster.from_url(cluster_stack.settings.redis_url)
    following = asyncio.create_task(follow_channel(subscriber, store.keys.finished_channel, on_message))
    try:
        for task_id in ids:
            assert await store.create_queued(task_id, now_ms(), "t1", model="m16") is None
        assert sorted(await store.mark_running(ids)) == sorted(ids)
        for _ in range(50):  # until the subscription is live: a probe comes back
            await subscriber.publish(store.keys.finished_channel, probe)
            try:
                await asyncio.wait_for(probe_heard.wait(), 0.1)
                break
            except TimeoutError:
                pass
        assert probe_heard.is_set(), "the subscription never heard its probe"
        # Each task in its own slot: a script call a slot, each with its own tasks' provenance.
        provenance = {task_id: b'{"batch_id":"%s"}' % task_id.encode() for task_id in ids}
        assert await store.mark_done({t: {"Y": t} for t in ids}, provenance=provenance) == len(ids)
        await asyncio.wait_for(all_heard.wait(), 5)
        assert await store.mark_done({ids[0]: {"Y": "again"}}) == 0  # final stays final
        records = [await store.get(task_id) for task_id in ids]
        assert all(
            r is not None and r.outputs == {"Y": r.task_id} and r.tenant == "t1" and r.model == "m16" for r in records
        )
        assert all(r is not None and r.provenance == {"batch_id": r.task_id} for r in records)
    finally:
        following.cancel()
        await subscriber.aclose()


async def test_in_flight_limit_is_exact_under_concurrency_and_frees_on_every_final_state(
    cluster_stack: EmbeddedStack, store: TaskStore
) -> None:
    client = RedisCluster.from_url(cluster_stack.settings.redis_url)
    try:
        in_flight = store.keys.in_flight("busy")
        ids = [uuid.uuid4().hex for _ in range(12)]
        refused = await asyncio.gather(*(store.create_queued(task_id, now_ms(), "busy", 5) for task_id in ids))
        admitted = [task_id for task_id, count in zip(ids, refused) if count is None]
        assert len(admitted) == 5 and all(count == 5 for count in refused if count is not None)
        assert await client.zcard(in_flight) == 5
        # A refused task leaves no record behind.
        assert all([await store.get(task_id) is None for task_id in ids if task_id not in admitted])
        assert await store.cancel(admitted[0])
        await store.mark_done({admitted[1]: {"Y": 1}})
        await store.mark_failed([admitted[2]], {"class": "model_error"})
        await store.forget(admitted[3], "busy")
        assert await client.zcard(in_flight) == 1
        await store.requeue(admitted[2], now_ms(), "busy")  # a DLQ replay counts again
        assert await client.zcard(in_flight) == 2
    finally:
        await client.aclose()


async def test_tasks_recorded_and_never_confirmed_give_their_quota_back_when_stale(store: TaskStore) -> None:
    # The records, the tenant's set and the unconfirmed set are in different slots here.
    await check_stale_entries_give_their_quota_back(store)


async def test_a_redelivered_task_found_final_leaves_its_tenants_in_flight_set(cluster_stack: EmbeddedStack) -> None:
    """A final move leaves the tenant's set in a second round trip here; a batcher stopped
    between the two left the entry. The task's redelivery mends it."""
    settings = cluster_stack.settings
    client = RedisCluster.from_url(settings.redis_url)
    keys = RedisKeys(settings.key_prefix)
    stack_store = TaskStore(client, keys, settings.result_ttl_s, settings.task_wait_ttl_s)
    task_id, tenant = uuid.uuid4().hex, "mended"
    try:
        submitted = now_ms()
        assert await stack_store.create_queued(task_id, submitted, tenant) is None
        # The first round trip of a final move, alone: the record says done, the set still counts it.
        await client.hset(keys.task(task_id), mapping={Field.STATUS: TaskStatus.DONE.value, Field.OUTPUTS: b"{}"})
        assert await client.zscore(keys.in_flight(tenant), task_id) is not None
        redelivered = TaskRequest(task_id=task_id, model=settings.model_name, tenant=tenant, submitted_at_ms=submitted)
        redelivered.inputs["TEXT"].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[b"again"]))
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(settings.requests_topic, redelivered.SerializeToString(), key=task_id.encode())
        finally:
            await producer.stop()

        async def left_the_set() -> bool:
            return await client.zscore(keys.in_flight(tenant), task_id) is None

        await wait_for(left_the_set, 30, "the redelivered final task to leave its tenant's in-flight set")
        record = await stack_store.get(task_id)
        assert record is not None and record.status is TaskStatus.DONE  # not run again
    finally:
        await client.aclose()

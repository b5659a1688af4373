"""Long-poll (GET and POST ?wait=), cancel before dispatch, and bulk submission."""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.model_catalogue import TensorSpec, encode_input
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.metrics import metric_values
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import rows_seen_by_model
from tests.helpers.task_client import TaskClient


async def test_get_with_wait_answers_when_the_result_is_stored(client: TaskClient) -> None:
    task_id = await client.submit({"TEXT": "long poll"})
    started = time.monotonic()
    status, body = await client.request("GET", f"/v1/tasks/{task_id}", params={"wait": "10"})
    assert status == 200 and body["status"] == "done"
    assert body["outputs"] == expected_outputs("long poll")
    assert time.monotonic() - started < 5  # woken by the result, not held for the full wait


async def test_get_with_wait_gives_up_after_the_wait(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    await tune_live(client, min_wait_ms=3000, max_wait_ms=3000)
    task_id = await client.submit({"TEXT": "slow to come"})
    started = time.monotonic()
    status, body = await client.request("GET", f"/v1/tasks/{task_id}", params={"wait": "0.5"})
    held = time.monotonic() - started
    assert status == 200 and body["status"] in ("queued", "running")
    assert 0.4 <= held < 2.5


async def test_post_with_wait_returns_the_result_inline(client: TaskClient) -> None:
    status, body = await client.request("POST", "/v1/tasks", params={"wait": "10"}, json={"inputs": {"TEXT": "inline"}})
    assert status == 200 and body["status"] == "done"
    assert body["outputs"] == expected_outputs("inline")


async def test_wait_out_of_range_is_400(client: TaskClient) -> None:
    for value in ("-1", "31", "soon", "nan"):
        status, body = await client.request("GET", f"/v1/tasks/{'0' * 32}", params={"wait": value})
        assert status == 400 and "wait" in body["error"]["message"], (value, body)


async def test_cancelled_task_never_reaches_the_model_and_leaves_its_slot(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    await tune_live(client, min_wait_ms=2000, max_wait_ms=2000)
    marker = f"cancel me {uuid.uuid4().hex}"
    before = await client.stats()
    doomed = await client.submit({"TEXT": marker})
    others = [await client.submit({"TEXT": f"keep {i} {marker}"}) for i in range(10)]
    status, body = await client.request("DELETE", f"/v1/tasks/{doomed}")
    assert status == 200 and body == {"task_id": doomed, "model": stack.settings.model_name, "status": "cancelled"}
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=20) for t in others))
    assert all(r["status"] == "done" for r in results)
    assert (await client.get(doomed))["status"] == "cancelled"
    seen = rows_seen_by_model(stack)
    assert marker not in seen, "the cancelled task reached the model"
    assert sum(1 for row in seen if row.startswith("keep ") and row.endswith(marker)) == 10
    after = await client.stats()
    assert after["rows_dispatched"] - before["rows_dispatched"] == 10  # the cancelled task took no slot
    status, body = await client.request("DELETE", f"/v1/tasks/{others[0]}")
    assert status == 409 and "done" in body["error"]["message"]
    status, _ = await client.request("DELETE", f"/v1/tasks/{'0' * 32}")
    assert status == 404


async def test_bulk_returns_ids_in_order_with_per_item_errors(client: TaskClient) -> None:
    items = [{"inputs": {"TEXT": "bulk a"}}, {"inputs": {"TEXT": 5}}, {"inputs": {"TEXT": "bulk c"}}, {"nope": 1}]
    status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": items})
    assert status == 200 and body["accepted"] == 2
    first, second, third, fourth = body["results"]
    assert second["error"]["code"] == "invalid_input" and "TEXT" in second["error"]["message"]
    assert fourth["error"]["code"] == "invalid_request"
    done = await asyncio.gather(client.wait_final(first["task_id"]), client.wait_final(third["task_id"]))
    assert [d["outputs"] for d in done] == [expected_outputs("bulk a"), expected_outputs("bulk c")]


async def test_bulk_over_the_limit_is_413(stack: EmbeddedStack, client: TaskClient) -> None:
    items = [{"inputs": {"TEXT": "x"}}] * (stack.settings.max_bulk_tasks + 1)
    status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": items})
    assert status == 413 and str(stack.settings.max_bulk_tasks) in body["error"]["message"]
    status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": []})
    assert status == 422


async def test_a_long_poll_learns_its_result_though_the_push_was_lost_with_the_subscription(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    """redis-py re-subscribes by itself after a dropped connection, silently: a result
    published in between reaches nobody, so the waiters must be told to look again."""
    redis = Redis.from_url(stack.settings.redis_url)
    store = TaskStore(redis, RedisKeys(stack.settings.key_prefix), stack.settings.result_ttl_s)
    try:
        for round_number in range(5):
            task_id = uuid.uuid4().hex
            await store.create_queued(task_id, now_ms())
            poll = asyncio.create_task(client.request("GET", f"/v1/tasks/{task_id}", params={"wait": "15"}))
            deadline = time.monotonic() + 5
            while (await metric_values(f"{stack.api_url}/metrics")).get("brimful_long_polls_waiting", 0) < 1:
                assert time.monotonic() < deadline, "the long-poll never started waiting"
            assert await redis.client_kill_filter(_type="pubsub") >= 1  # the API's subscription drops
            await store.mark_done({task_id: {"ROUND": round_number}})  # published while nobody listens
            finished_at = time.monotonic()
            status, body = await poll
            assert status == 200 and body["status"] == "done" and body["outputs"] == {"ROUND": round_number}
            assert time.monotonic() - finished_at < 3, "the waiter sat on although its task had finished"
    finally:
        await redis.aclose()


async def test_a_task_whose_record_is_gone_is_never_run(stack: EmbeddedStack, client: TaskClient) -> None:
    """A task cancelled an hour before the batcher reaches it (its record expired since),
    or one whose enqueue was undone after the broker had in fact appended it: the record
    on the topic must not run, nor bring the task back."""
    settings = stack.settings
    redis = Redis.from_url(settings.redis_url)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        task_id = uuid.uuid4().hex
        text = f"cancelled long ago {task_id}"
        await store.create_queued(task_id, now_ms())
        assert await store.cancel(task_id)
        await redis.delete(store.keys.task(task_id))  # what its expiry does, an hour later
        request = TaskRequest(task_id=task_id, model=settings.model_name, submitted_at_ms=now_ms())
        request.inputs["TEXT"].CopyFrom(encode_input(TensorSpec("TEXT", "BYTES", (1,)), text))
        sent = await producer.send_and_wait(settings.requests_topic, request.SerializeToString(), key=task_id.encode())

        async def past_the_record() -> bool:
            return any(
                state["committed"] > sent.offset
                for batcher in (await client.stats())["batchers"]
                for number, state in batcher["partitions"].items()
                if int(number) == sent.partition
            )

        await wait_for(past_the_record, 30, "the batcher to commit past the record")
        assert text not in rows_seen_by_model(stack)
        assert await store.get(task_id) is None
    finally:
        await producer.stop()
        await redis.aclose()

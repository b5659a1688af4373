"""Idempotency-Key: a retried POST gets the original task, never a second one."""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import NewTask
from brimful.core.task_store import TaskStore
from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.stacks import rows_seen_by_model
from tests.helpers.task_client import TaskClient


async def post(client: TaskClient, text: str, key: str) -> tuple[int, dict]:
    return await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}}, headers={"Idempotency-Key": key})


async def test_retry_with_the_same_key_returns_the_original_task(client: TaskClient) -> None:
    key = f"order-{uuid.uuid4()}"
    status, first = await post(client, "pay once", key)
    assert status == 202
    status, again = await post(client, "pay once", key)
    assert status == 200 and again["task_id"] == first["task_id"]
    task = await client.wait_final(first["task_id"])
    assert task["outputs"] == expected_outputs("pay once")
    status, after = await post(client, "pay once", key)
    assert status == 200 and after["task_id"] == first["task_id"] and after["status"] == "done"
    assert after["outputs"] == expected_outputs("pay once")


async def test_concurrent_posts_with_one_key_make_one_task(client: TaskClient) -> None:
    key = f"burst-{uuid.uuid4()}"
    answers = await asyncio.gather(*(post(client, "same request", key) for _ in range(30)))
    assert sorted(status for status, _ in answers) == [200] * 29 + [202]
    assert len({body["task_id"] for _, body in answers}) == 1


async def test_malformed_key_is_400(client: TaskClient) -> None:
    status, body = await post(client, "x", "has space")
    assert status == 400 and body["error"]["code"] == "invalid_idempotency_key"
    status, body = await post(client, "x", "k" * 256)
    assert status == 400


async def test_a_key_whose_first_use_failed_midway_is_free_for_the_retry(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    """A Redis error after the key is claimed (here: the tenants' limits hash is not a
    hash) used to leave the key bound to a task never accepted: the retry heard
    "200, queued" for an id whose GET was 404 for ever."""
    redis = Redis.from_url(stack.settings.redis_url)
    limits = RedisKeys(stack.settings.key_prefix).tenant_limits
    key = f"midway-{uuid.uuid4()}"
    await redis.set(limits, "not a hash")
    try:
        deadline = time.monotonic() + 5
        while (await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "probe"}}))[0] != 503:
            assert time.monotonic() < deadline, "the API kept its cached limits"  # cached for up to 1 s
        status, body = await post(client, "retried after a failure", key)
        assert status == 503 and body["error"]["code"] == "dependency_unavailable", body
    finally:
        await redis.delete(limits)
        await redis.aclose()
    status, body = await post(client, "retried after a failure", key)
    assert status == 202, body
    task = await client.wait_final(body["task_id"])
    assert task["status"] == "done" and task["outputs"] == expected_outputs("retried after a failure")


async def test_a_retry_after_the_api_died_midway_gets_the_task_it_had_recorded(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    """An API killed (or stopped past its grace) between recording a task and binding its
    key leaves the key claimed for that task. A retry once the claim is older than any
    submission can take gets that task, sent again should its record never have reached
    the broker, and computed once; never a second task, nor a task that never runs."""
    redis = Redis.from_url(stack.settings.redis_url)
    store = TaskStore(
        redis, RedisKeys(stack.settings.key_prefix), stack.settings.result_ttl_s, stack.settings.task_wait_ttl_s
    )
    text, key = f"recorded, then the API died {uuid.uuid4().hex}", f"died-{uuid.uuid4()}"
    try:
        recorded = uuid.uuid4().hex
        (outcome,) = await store.create_queued_many(
            [NewTask(recorded, now_ms(), "", 0, stack.settings.model_name, f"/{key}")]
        )
        assert outcome is None
        await redis.set(
            store.keys.idempotency(f"/{key}"), f"pending:{recorded}:{now_ms() - 120_000}"
        )  # two minutes ago

        status, body = await post(client, text, key)
        assert status == 200 and body["task_id"] == recorded, body
        done = await client.wait_final(recorded)
        assert done["status"] == "done" and done["outputs"] == expected_outputs(text)
        status, again = await post(client, text, key)
        assert status == 200 and again["task_id"] == recorded and again["status"] == "done"
        assert rows_seen_by_model(stack).count(text) == 1

        # Killed before even recording it: the key is the retry's, for a task of its own.
        never, other = uuid.uuid4().hex, f"never-{uuid.uuid4()}"
        await redis.set(store.keys.idempotency(f"/{other}"), f"pending:{never}:{now_ms() - 120_000}")
        status, body = await post(client, text + " again", other)
        assert status == 202 and body["task_id"] != never, body
        assert (await client.wait_final(body["task_id"]))["status"] == "done"
    finally:
        await redis.aclose()

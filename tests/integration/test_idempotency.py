"""Idempotency-Key: a retried POST gets the original task, never a second one."""

from __future__ import annotations

import asyncio
import uuid

from tests.integration.test_pipeline import expected_outputs
from tests.task_client import TaskClient


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

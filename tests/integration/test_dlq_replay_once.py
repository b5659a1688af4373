"""A DLQ replay never reopens a task. After a rebalance or a retried batch one task can
have two dead letters: replaying both runs it once, and replaying the second after the
first has brought the task to done leaves its result as the client read it."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from brimful.core.dead_letter_index import DeadLetterIndex
from brimful.core.kafka import make_producer
from brimful.core.redis_keys import RedisKeys
from brimful.schemas import DeadLetter
from brimful.stack import EmbeddedStack
from brimful.workers.dead_letters import DeadLetterWriter
from tests.helpers.pipeline import expected_outputs, read_dead_letters
from tests.helpers.stacks import fault_file, rows_seen_by_model
from tests.helpers.task_client import TaskClient


async def letter_again(stack: EmbeddedStack, letter: DeadLetter) -> None:
    """A second copy of ``letter`` on the DLQ topic, written (and indexed) as a batcher that
    runs a batch twice writes it."""
    settings = stack.settings
    producer = make_producer(settings)
    redis = Redis.from_url(settings.redis_url)
    await producer.start()
    try:
        index = DeadLetterIndex(redis, RedisKeys(settings.key_prefix), settings.task_wait_ttl_s)
        await DeadLetterWriter(producer, settings.dlq_topic, settings.kafka_max_message_bytes, index).write([letter])
    finally:
        await producer.stop()
        await redis.aclose()


async def replay(client: TaskClient, task_id: str) -> dict:
    status, body = await client.request("POST", "/v1/admin/dlq/replay", json={"ids": [task_id]})
    assert status == 200, body
    return body


async def test_a_task_with_two_dead_letters_is_replayed_once_and_never_reopened(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    text = f"!flaky with two letters {uuid.uuid4().hex}"
    switch = fault_file(stack)
    switch.touch()
    try:
        task_id = await client.submit({"TEXT": text})
        assert (await client.wait_final(task_id))["status"] == "failed"
    finally:
        switch.unlink()
    (letter,) = [dl for dl in await read_dead_letters(stack) if dl.request.task_id == task_id]
    await letter_again(stack, letter)
    status, listed = await client.request("GET", f"/v1/admin/dlq?ids={task_id}")
    assert status == 200 and len(listed["entries"]) == 2, listed

    calls_before = rows_seen_by_model(stack).count(text)
    answer = await replay(client, task_id)
    assert answer["task_ids"] == [task_id] and len(answer["skipped"]) == 1, answer
    done = await client.wait_final(task_id)
    assert done["status"] == "done" and done["outputs"] == expected_outputs(text)
    assert rows_seen_by_model(stack).count(text) == calls_before + 1  # computed once, not twice

    # A third letter of it comes to light (a batcher that wrote one late): replaying it
    # after the client read the result changes nothing.
    await letter_again(stack, letter)
    answer = await replay(client, task_id)
    assert answer["task_ids"] == [] and len(answer["skipped"]) == 1, answer
    again = await client.get(task_id)
    assert again["status"] == "done" and again["outputs"] == done["outputs"]
    assert again["updated_at_ms"] == done["updated_at_ms"]
    status, listed = await client.request("GET", f"/v1/admin/dlq?ids={task_id}&all=true")
    assert sorted(entry["status"] for entry in listed["entries"]) == ["not_replayed", "not_replayed", "replayed"]

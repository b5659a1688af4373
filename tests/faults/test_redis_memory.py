"""Redis at its memory limit, as a Redis that must keep its data runs (``maxmemory`` with
``noeviction``): the API stops admitting work before Redis refuses writes (503 with
Retry-After, never a 500), and every task it accepted is stored once memory is back,
never failed for it. And memory follows the unread results: a result a client has read is
kept ``result_ttl_after_read_s``, one never read its full ``result_ttl_s``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from redis.asyncio import Redis

from brimful.api.tasks.task_waiters import FLUSH_S
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient

READ_TTL_S = 120


@pytest.fixture(scope="module")
def memory_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("redis-memory"),
        stack_settings(topic_partitions=2, result_ttl_after_read_s=READ_TTL_S),
    )
    yield running
    running.stop()


async def test_accepted_tasks_are_held_through_redis_at_its_limit_and_none_fails(
    memory_stack: EmbeddedStack,
) -> None:
    redis = Redis.from_url(memory_stack.settings.redis_url)
    tag = uuid.uuid4().hex
    texts = [f"at the memory limit {tag} {n % 40}" for n in range(200)]  # identical ones too
    batcher = memory_stack.processes["batcher-0"]
    try:
        async with TaskClient(memory_stack.api_url) as client:
            batcher.stop()  # the tasks wait in Kafka while Redis fills
            task_ids = [await client.submit({"TEXT": text}) for text in texts]
            used = int((await redis.info("memory"))["used_memory"])
            await redis.config_set("maxmemory-policy", "noeviction")
            await redis.config_set("maxmemory", str(used + 16 * 1024))  # no room for 200 results
            memory_stack.start_batcher("batcher-0")

            async def refused_cleanly() -> bool:
                async with httpx.AsyncClient(base_url=memory_stack.api_url, timeout=10) as http:
                    answer = await http.post("/v1/tasks", json={"inputs": {"TEXT": f"refused {tag}"}})
                assert answer.status_code in (202, 503), answer.text  # never a 500
                return answer.status_code == 503 and answer.headers.get("retry-after") == "1"

            await wait_for(refused_cleanly, 15, "the API to refuse new work, Redis near its limit")

            await redis.config_resetstat()  # from here on, only the batcher writes

            async def batcher_refused() -> bool:
                refused = (await redis.info("errorstats")).get("errorstat_OOM", {}).get("count", 0)
                return int(refused) > 0

            # Its writes refused (marking tasks running, or storing results): its batches
            # are held, and none of their tasks failed for it.
            await wait_for(batcher_refused, 30, "Redis to refuse the batcher's writes")
            answers = [await client.get(task_id) for task_id in task_ids]
            assert "failed" not in [answer["status"] for answer in answers]
            await redis.config_set("maxmemory", "0")  # memory is back

            async def all_final() -> bool:
                answers = [await client.get(task_id) for task_id in task_ids]
                return all(answer["status"] in ("done", "failed") for answer in answers)

            await wait_for(all_final, 60, "every accepted task to finish")
            answers = [await client.get(task_id) for task_id in task_ids]
            assert [answer["status"] for answer in answers] == ["done"] * len(texts)
            assert [answer["outputs"] for answer in answers] == [expected_outputs(text) for text in texts]
            await wait_for(lambda: _admits(memory_stack), 15, "the API to admit work again, memory back")
    finally:
        await redis.config_set("maxmemory", "0")
        await redis.aclose()


async def test_a_result_once_read_is_kept_a_shorter_while_with_its_idempotency_key(
    memory_stack: EmbeddedStack,
) -> None:
    keys = RedisKeys(memory_stack.settings.key_prefix)
    redis = Redis.from_url(memory_stack.settings.redis_url)
    try:
        await wait_for(lambda: _admits(memory_stack), 15, "the API to admit work (Redis has room)")
        async with TaskClient(memory_stack.api_url) as client:
            tag = uuid.uuid4().hex
            status, body = await client.request(
                "POST", "/v1/tasks", json={"inputs": {"TEXT": f"read {tag}"}}, headers={"Idempotency-Key": f"r-{tag}"}
            )
            assert status == 202, body
            read_id = str(body["task_id"])
            unread_id = await client.submit({"TEXT": f"unread {tag}"})
            await client.wait_final(read_id)  # a read of its final state
            await wait_for(lambda: _final(redis, keys, unread_id), 30, "the unread task to finish")

            async def shortened() -> bool:
                return 0 < await redis.ttl(keys.task(read_id)) <= READ_TTL_S

            await wait_for(shortened, 10 * FLUSH_S + 5, "the read result's retention to be shortened")
            assert await redis.ttl(keys.task(unread_id)) > READ_TTL_S  # never read: its full hour
            idempotency_key = await redis.hget(keys.task(read_id), "idem")
            assert idempotency_key

            async def key_shortened() -> bool:  # a second pipeline, after the records' (api/tasks/task_waiters.py)
                return 0 < await redis.ttl(idempotency_key) <= READ_TTL_S

            await wait_for(key_shortened, 10 * FLUSH_S + 5, "the Idempotency-Key's retention to be shortened")
    finally:
        await redis.aclose()


async def _admits(stack: EmbeddedStack) -> bool:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as http:
        answer = await http.post("/v1/tasks", json={"inputs": {"TEXT": f"admitted {uuid.uuid4().hex}"}})
    return answer.status_code == 202


async def _final(redis: Redis, keys: RedisKeys, task_id: str) -> bool:
    return (await redis.hget(keys.task(task_id), "status")) in (b"done", b"failed")

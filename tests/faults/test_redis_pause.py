"""A Redis that stops answering (``CLIENT PAUSE``, a wedged server, a network partition)
holds no request past its bound: the API answers 503 with Retry-After within
``redis_timeout_s`` and some slack, every process stays up, and once Redis answers again
every task accepted before, during or after the pause is done."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from brimful.stack import EmbeddedStack
from tests.helpers.stacks import start_wide_stack
from tests.helpers.task_client import TaskClient

PAUSE_S = 8
REDIS_TIMEOUT_S = 1.0
BOUND_S = REDIS_TIMEOUT_S + 2.0  # one command's timeout, and a request's own work


@pytest.fixture(scope="module")
def wide_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_wide_stack(tmp_path_factory.mktemp("redis-pause"), redis_timeout_s=REDIS_TIMEOUT_S)
    yield running
    running.stop()


async def timed(client: TaskClient, method: str, path: str, **kwargs: object) -> tuple[float, int, dict, str | None]:
    started = time.monotonic()
    async with client.session.request(method, path, **kwargs) as response:  # type: ignore[arg-type]
        body = await response.json(content_type=None)
        return time.monotonic() - started, response.status, body, response.headers.get("Retry-After")


async def test_a_paused_redis_gets_503_with_retry_after_within_the_bound_and_nothing_is_lost(
    wide_stack: EmbeddedStack,
) -> None:
    redis = Redis.from_url(wide_stack.settings.redis_url)
    tag = uuid.uuid4().hex
    try:
        async with TaskClient(wide_stack.api_url) as client:
            before = await client.submit({"TEXT": f"before the pause {tag}"})
            assert (await client.wait_final(before))["status"] == "done"
            await redis.execute_command("CLIENT", "PAUSE", PAUSE_S * 1000, "ALL")
            paused_at = time.monotonic()
            answers = await asyncio.gather(
                timed(client, "POST", "/v1/tasks", json={"inputs": {"TEXT": f"during the pause {tag}"}}),
                timed(client, "GET", f"/v1/tasks/{before}"),
                timed(client, "GET", f"/v1/tasks/{before}?wait=5"),
            )
            assert time.monotonic() - paused_at < PAUSE_S - 2, "the answers came only once the pause ended"
            for took, status, body, retry_after in answers:
                assert took < BOUND_S and status == 503, (took, status, body)
                assert body["error"]["code"] == "dependency_unavailable" and retry_after, body
            took, status, _, _ = await timed(client, "GET", "/healthz")
            assert status == 200 and took < 1.0  # liveness asks no Redis
            # Every process rides it out.
            await asyncio.sleep(max(0.0, PAUSE_S - (time.monotonic() - paused_at)))
            assert all(process.running() for process in wide_stack.processes.values())
            after = await client.submit({"TEXT": f"after the pause {tag}"})
            for task_id in (before, after):
                assert (await client.wait_final(task_id, timeout_s=30))["status"] == "done"
    finally:
        await redis.aclose()

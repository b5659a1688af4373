"""API workers killed between recording tasks and hearing from the broker: the tasks they
recorded give their tenant's quota back (``core/admission.py``).

The stack is the production shape's front: two API workers behind one port, auth on, a
tenant with a small in-flight limit, two partitions. The producer's linger is raised so a
task's record waits in the worker for seconds after its task is recorded in Redis: the
workers are killed (SIGKILL) inside that window, so the records certainly never reach the
broker, and uvicorn's supervisor starts new workers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import aiohttp
import pytest
from redis.asyncio import Redis

from brimful.api.tasks.group_commit import released_within_s
from brimful.core.admission import task_of
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_client import as_text
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import TaskStatus
from brimful.core.task_store import TaskStore
from brimful.core.tenant_limits import TenantLimits, TenantLimitStore
from brimful.stack import EmbeddedStack
from brimful.stack.processes import http_ok
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import api_workers, stack_settings, start_stack

LIMIT = 4  # the tenant's tasks in flight
LINGER_MS = 4000  # how long a recorded task's record waits in its worker before it is sent
TENANT = "crashy"


@pytest.fixture(scope="module")
def lingering_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    settings = stack_settings(
        api_workers=2,
        auth_enabled=True,
        topic_partitions=2,
        kafka_linger_ms=LINGER_MS,
        # Every group at once, not after the last one's answer: all the tenant's tasks are then
        # recorded while the first record still lingers, which is the window under test.
        submit_groups_unacknowledged=0,
        # Short timeouts, so a submission's longest (and the sweep's wait) is seconds.
        kafka_request_timeout_ms=8000,
        redis_pool_timeout_s=1.0,
    )
    running = start_stack(tmp_path_factory.mktemp("lingering-stack"), settings)
    yield running
    running.stop()


async def post(session: aiohttp.ClientSession, text: str) -> tuple[int, dict]:
    async with session.post("/v1/tasks", json={"inputs": {"TEXT": text}}) as response:
        return response.status, await response.json(content_type=None)


async def test_tasks_of_killed_api_workers_give_their_tenants_quota_back(lingering_stack: EmbeddedStack) -> None:
    settings = lingering_stack.settings
    keys = RedisKeys(settings.key_prefix)
    redis = Redis.from_url(settings.redis_url)
    try:
        key, _ = await ApiKeys(redis, keys).create(TENANT, [Scope.SUBMIT, Scope.READ])
        await TenantLimitStore(redis, keys, TenantLimits(0, 0)).set(TENANT, max_in_flight=LIMIT)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(lingering_stack.api_url, headers=headers) as session:
            posts = [asyncio.create_task(post(session, f"lost {i}")) for i in range(LIMIT)]

            async def all_recorded() -> bool:
                return int(await redis.zcard(keys.in_flight(TENANT))) == LIMIT

            await wait_for(all_recorded, LINGER_MS / 1000 / 2, "the tasks to be recorded", interval_s=0.02)
            workers = api_workers(lingering_stack)
            assert len(workers) == 2
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            answers = await asyncio.gather(*posts, return_exceptions=True)
            # Killed before the broker heard of them: no client was told its task was accepted.
            assert not [a for a in answers if isinstance(a, tuple) and a[0] == 202], answers
            recorded = [task_of(as_text(m)) for m in await redis.zrange(keys.unconfirmed, 0, -1)]
            lost = [task_id for task_id, tenant in recorded if tenant == TENANT]
            assert len(lost) == LIMIT

            await wait_for(lambda: http_ok(f"{lingering_stack.api_url}/readyz"), 60, "new API workers")
            # The new workers are up well before the lost tasks turn stale: the quota is still held.
            status, body = await post(session, "refused")
            assert (status, body["error"]["code"]) == (429, "too_many_in_flight"), body

            accepted: dict[str, str] = {}

            async def one_accepted() -> bool:
                status, body = await post(session, "after the sweep")
                if status == 202:
                    accepted["task_id"] = body["task_id"]
                return status == 202

            await wait_for(one_accepted, released_within_s(settings) + 20, "the quota back", 1.0)
            async with session.get(f"/v1/tasks/{accepted['task_id']}?wait=30") as response:
                done = await response.json()
            assert done["status"] == "done" and done["outputs"] == expected_outputs("after the sweep")

        store = TaskStore(redis, keys, 60)
        for task_id in lost:
            record = await store.get(task_id)
            # Never sent, so never run: left queued (its client never had its id), out of the count.
            assert record is not None and record.status is TaskStatus.QUEUED
            assert await redis.zscore(keys.in_flight(TENANT), task_id) is None
        assert not set(lost) & {task_of(as_text(m))[0] for m in await redis.zrange(keys.unconfirmed, 0, -1)}
        log = (lingering_stack.workdir / "logs" / "api.log").read_text(encoding="utf-8")
        assert "released tasks never confirmed" in log
        assert all(task_id in log for task_id in lost)
    finally:
        await redis.aclose()

"""One tenant's batch jobs never stall another tenant's: with a hundred jobs of one tenant
active (their tasks held, the batcher stopped), another tenant's new job is validated and,
past its completion window, ends ``expired``; the busy tenant's next job is refused (429)."""

from __future__ import annotations

import io
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest

from brimful.api.jobs.job_driver import BatchJobs
from brimful.api.state import ApiState
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.batch_records import BatchRecord, new_batch_id
from brimful.core.batch_status import BatchStatus
from brimful.core.file_records import new_file_id
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack

BUSY_JOBS = 100  # the default per-tenant cap; before the fix, drivers looked at the 100 oldest only


@pytest.fixture(scope="module")
def jobs_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("job-fairness"),
        stack_settings(auth_enabled=True, api_workers=2, topic_partitions=2, batch_job_window=2),
    )
    yield running
    running.stop()


async def _tenant_client(stack: EmbeddedStack, tenant: str) -> httpx.AsyncClient:
    redis = make_redis(stack.settings)
    try:
        key = (await ApiKeys(redis, RedisKeys(stack.settings.key_prefix)).create(tenant, [Scope.SUBMIT, Scope.READ]))[0]
    finally:
        await redis.aclose()
    return httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
async def busy(jobs_stack: EmbeddedStack) -> AsyncIterator[httpx.AsyncClient]:
    async with await _tenant_client(jobs_stack, "busy-tenant") as client:
        yield client


@pytest.fixture
async def quiet(jobs_stack: EmbeddedStack) -> AsyncIterator[httpx.AsyncClient]:
    async with await _tenant_client(jobs_stack, "quiet-tenant") as client:
        yield client


async def _upload(client: httpx.AsyncClient, lines: int) -> str:
    body = b"".join(
        orjson.dumps({"custom_id": f"l-{n}", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": "t"}}})
        + b"\n"
        for n in range(lines)
    )
    answer = await client.post("/v1/files", files={"file": ("in.jsonl", io.BytesIO(body))}, data={"purpose": "batch"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


async def _create(client: httpx.AsyncClient, file_id: str, window: str = "24h") -> httpx.Response:
    return await client.post(
        "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/tasks", "completion_window": window}
    )


async def test_a_tenant_with_a_hundred_jobs_stalls_no_other_tenants_job(
    jobs_stack: EmbeddedStack, busy: httpx.AsyncClient, quiet: httpx.AsyncClient
) -> None:
    jobs_stack.processes["batcher-0"].stop()  # every job's tasks wait: no job ends by itself
    try:
        busy_file = await _upload(busy, 10)
        for _ in range(BUSY_JOBS):
            created = await _create(busy, busy_file)
            assert created.status_code == 200, created.text
        refused = await _create(busy, busy_file)
        assert refused.status_code == 429 and "this tenant" in refused.json()["error"]["message"], refused.text

        quiet_job = (await _create(quiet, await _upload(quiet, 3), window="10s")).json()

        async def quiet_status() -> str:
            return str((await quiet.get(f"/v1/batches/{quiet_job['id']}")).json()["status"])

        async def validated() -> bool:
            return await quiet_status() != "validating"

        await wait_for(validated, 15, "the quiet tenant's job to be validated")

        async def expired() -> bool:
            return await quiet_status() == "expired"

        await wait_for(expired, 30, "the quiet tenant's job to end expired after its 10 s window")
        job = (await quiet.get(f"/v1/batches/{quiet_job['id']}")).json()
        counts = job["request_counts"]
        assert counts["total"] == 3 and counts["completed"] + counts["failed"] == 3, job
        errors = (await quiet.get(f"/v1/files/{job['error_file_id']}/content")).content.splitlines()
        assert sorted(orjson.loads(line)["custom_id"] for line in errors) == ["l-0", "l-1", "l-2"]
    finally:
        jobs_stack.start_batcher("batcher-0")


async def test_a_job_refused_for_now_never_reads_its_input_again(jobs_stack: EmbeddedStack) -> None:
    """A job whose tenant is at its in-flight limit is refused (429) again and again; it
    keeps its place in its input, so the input is opened twice in all (counted, then run),
    not once a refusal. The stack's API workers are stopped: this process's driver, over
    the stack's real Redis, broker and batcher, is the only one."""
    jobs_stack.processes["api"].stop()
    settings = jobs_stack.settings.model_copy(update={"auth_enabled": False})
    state = ApiState(settings)
    await state.start()
    try:
        await state.wait_until_serving(30)
        await state.tenant_limits.set("refused-tenant", max_in_flight=1)  # below the job's window of 2
        opened: Counter[str] = Counter()  # object name -> times opened (other jobs of the module run too)
        real_lines = state.object_store.lines

        def counted(name: str, max_line_bytes: int) -> AsyncIterator[bytes]:
            opened[name] += 1
            return real_lines(name, max_line_bytes)

        state.object_store.lines = counted  # type: ignore[method-assign]
        lines = [
            orjson.dumps(
                {"custom_id": f"r-{n}", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": f"r {n}"}}}
            )
            for n in range(40)
        ]
        file_id = new_file_id()
        async with state.object_store.writer(file_id) as writer:
            await writer.write(b"\n".join(lines) + b"\n")
        now = int(time.time())
        record = BatchRecord(
            new_batch_id(), "refused-tenant", "/v1/tasks", file_id, "24h", BatchStatus.VALIDATING, now, now + 86400
        )
        await state.batch_records.add(record)
        jobs = BatchJobs(state, state.batch_records)
        pauses = 0

        async def completed() -> bool:
            nonlocal pauses
            await jobs.tick()
            pauses += jobs._paused.get(record.batch_id, 0.0) > time.monotonic()  # refused (429), waiting
            found = await state.batch_records.get(record.batch_id)
            return found is not None and found.status is BatchStatus.COMPLETED

        await wait_for(completed, 240, "the job to complete through its refusals", interval_s=0.2)
        assert pauses >= 5
        assert opened[file_id] == 2
    finally:
        await state.stop()
        jobs_stack.start_api()

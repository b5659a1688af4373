"""Uploads and the storage behind them, from outside: an upload that trickles for ever is
cut; one tenant's uploads cannot lock another out; a tenant's files keep within its quota;
and what a crash or an ended job leaves in the store is swept. A dedicated stack with
small bounds (auth on, two API workers)."""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.tenant_limits import TenantLimits, TenantLimitStore
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.slow_uploads import trickle
from tests.helpers.stacks import stack_settings, start_stack

UPLOAD_MAX_S = 3.0
IDLE_S = 2.0
PER_TENANT = 2
QUOTA = 1000


@pytest.fixture(scope="module")
def upload_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("uploads"),
        stack_settings(
            auth_enabled=True,
            api_workers=2,
            file_upload_max_s=UPLOAD_MAX_S,
            api_read_timeout_s=IDLE_S,
            file_uploads_per_tenant=PER_TENANT,
            file_sweep_interval_s=1.0,
        ),
    )
    yield running
    running.stop()


async def _client(stack: EmbeddedStack, tenant: str, quota: int = 0) -> httpx.AsyncClient:
    redis = make_redis(stack.settings)
    try:
        keys = RedisKeys(stack.settings.key_prefix)
        key = (await ApiKeys(redis, keys).create(tenant, [Scope.SUBMIT, Scope.READ]))[0]
        if quota:
            await TenantLimitStore(redis, keys, TenantLimits(0, 0)).set(tenant, max_stored_bytes=quota)
    finally:
        await redis.aclose()
    return httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
async def tenant(upload_stack: EmbeddedStack, request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    async with await _client(upload_stack, f"uploader-{request.node.name[:40]}") as client:
        yield client


async def test_an_upload_that_trickles_for_ever_is_cut_at_its_total_time(
    upload_stack: EmbeddedStack, tenant: httpx.AsyncClient
) -> None:
    key = tenant.headers["Authorization"].split()[1]
    started = time.monotonic()
    answer = await asyncio.wait_for(trickle(upload_stack.settings.api_port, key, asyncio.Event()), UPLOAD_MAX_S + 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < UPLOAD_MAX_S + 3


async def test_one_tenants_trickling_uploads_lock_no_other_tenant_out(
    upload_stack: EmbeddedStack, tenant: httpx.AsyncClient
) -> None:
    key = tenant.headers["Authorization"].split()[1]
    stop = asyncio.Event()
    trickles = [asyncio.create_task(trickle(upload_stack.settings.api_port, key, stop)) for _ in range(8)]
    try:
        # Past its places (two a worker), the tenant's next uploads are refused at once.
        await wait_for(
            lambda: sum(t.done() for t in trickles) >= 8 - 2 * PER_TENANT, 5, "uploads past the bound refused"
        )
        refused = [t.result() for t in trickles if t.done()]
        assert refused and all(answer.startswith(b"HTTP/1.1 429") for answer in refused), refused
        async with await _client(upload_stack, "bystander") as other:
            listed = await other.get("/v1/files")
            assert listed.status_code == 200, listed.text
            uploaded = await other.post(
                "/v1/files", files={"file": ("a.jsonl", io.BytesIO(b"{}\n"))}, data={"purpose": "batch"}
            )
            assert uploaded.status_code == 200, uploaded.text
    finally:
        stop.set()
        await asyncio.gather(*trickles, return_exceptions=True)


async def test_a_tenants_files_keep_within_its_quota(upload_stack: EmbeddedStack) -> None:
    async with await _client(upload_stack, "quota-tenant", quota=QUOTA) as client:

        async def upload(size: int) -> httpx.Response:
            return await client.post(
                "/v1/files", files={"file": ("q.jsonl", io.BytesIO(b"q" * size))}, data={"purpose": "batch"}
            )

        first = await upload(600)
        assert first.status_code == 200, first.text
        second = await upload(600)  # 400 bytes of room left: cut there
        assert second.status_code == 413, second.text
        assert (await client.delete(f"/v1/files/{first.json()['id']}")).status_code == 200
        again = await upload(900)  # the deleted file's bytes are free again
        assert again.status_code == 200, again.text
        full = await upload(200)
        assert full.status_code == 413 and full.json()["error"]["code"] in ("storage_quota_exceeded", "file_too_large")


async def test_objects_nothing_points_to_are_swept_and_files_with_records_stay(
    upload_stack: EmbeddedStack, tenant: httpx.AsyncClient
) -> None:
    folder = Path(upload_stack.settings.file_store_url)
    kept = await tenant.post("/v1/files", files={"file": ("k.jsonl", io.BytesIO(b"{}\n"))}, data={"purpose": "batch"})
    kept_id = kept.json()["id"]
    orphans = ["file-" + "ab" * 12, "file-" + "cd" * 12 + ".writing-0123456789ab", "batch_" + "ef" * 12 + ".output.0"]
    long_ago = time.time() - 2 * UPLOAD_MAX_S - 600
    for name in orphans:
        (folder / name).write_bytes(b"left behind")
        os.utime(folder / name, (long_ago, long_ago))
    os.utime(folder / kept_id, (long_ago, long_ago))
    await wait_for(lambda: not any((folder / name).exists() for name in orphans), 15, "the orphans to be swept")
    assert (folder / kept_id).exists()
    assert (await tenant.get(f"/v1/files/{kept_id}/content")).content == b"{}\n"


async def test_an_upload_cut_by_a_crash_leaves_no_file_under_a_final_name(
    upload_stack: EmbeddedStack, tenant: httpx.AsyncClient
) -> None:
    folder = Path(upload_stack.settings.file_store_url)
    before = _names(folder)
    key = tenant.headers["Authorization"].split()[1]
    stop = asyncio.Event()
    cut = asyncio.create_task(trickle(upload_stack.settings.api_port, key, stop))

    def writing() -> bool:
        return any(".writing-" in name for name in _names(folder))

    await wait_for(writing, 10, "the upload to be written")
    upload_stack.restart("api")  # every worker: the upload is cut mid-way
    stop.set()
    await asyncio.gather(cut, return_exceptions=True)
    new = _names(folder) - before
    assert all(".writing-" in name for name in new), new  # nothing under a file's name


def _names(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}

"""Brimful's own Python client for batch jobs and webhook endpoints, against the stack in
production shape (auth on, two API workers, two partitions)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from brimful.stack import EmbeddedStack
from brimful_client import AsyncClient, BrimfulError, Client, task_lines
from tests.helpers.pipeline import expected_outputs


def test_a_batch_job_runs_from_inputs_to_answers_by_custom_id(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str]
) -> None:
    run = uuid.uuid4().hex
    texts = [f"client job {run} {i % 7}" for i in range(30)]  # identical inputs among them
    inputs: list[dict[str, Any]] = [{"TEXT": text} for text in texts] + [{"TEXT": f"!fail client job {run}"}]
    seen: list[dict[str, Any]] = []
    with Client(openai_stack.api_url, api_key=openai_keys["submit"]) as client:
        created = client.create_batch(task_lines(inputs), metadata={"run": run})
        assert created["status"] in ("validating", "in_progress") and created["metadata"] == {"run": run}
        job = client.wait_batch(created["id"], timeout_s=120, poll_s=0.2, progress=seen.append)
        assert job["status"] == "completed" and job["request_counts"] == {"total": 31, "completed": 30, "failed": 1}
        assert seen[-1] == job and all(polled["id"] == created["id"] for polled in seen)
        output = client.batch_output(job)
        assert set(output) == {str(i) for i in range(30)}
        for i, text in enumerate(texts):
            response = output[str(i)]["response"]
            assert response["status_code"] == 200
            assert response["body"]["outputs"] == expected_outputs(text)
        (failed,) = client.batch_errors(job)
        assert failed["custom_id"] == "30" and failed["response"]["status_code"] == 502
        assert failed["response"]["body"]["error"]["code"] == "task_failed"
        with pytest.raises(BrimfulError) as foreign:
            Client(openai_stack.api_url, api_key=openai_keys["other"]).batch(created["id"])
        assert foreign.value.status == 404
        with pytest.raises(ValueError, match="endpoint must be one of"):
            client.create_batch(task_lines(inputs), endpoint="/v1/chat/completions")


async def test_a_cancelled_job_ends_cancelled(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> None:
    inputs = [{"TEXT": f"cancel via client {uuid.uuid4().hex} {i}"} for i in range(400)]
    async with AsyncClient(openai_stack.api_url, api_key=openai_keys["submit"]) as client:
        created = await client.create_batch(task_lines(inputs))
        assert (await client.cancel_batch(created["id"]))["status"] in ("cancelling", "cancelled")
        job = await client.wait_batch(created["id"], timeout_s=120, poll_s=0.2)
        assert job["status"] == "cancelled"
        counts = job["request_counts"]
        # At most OPENAI_JOB_WINDOW lines run at once: cancelled at once, most never ran, and
        # each of those is in the error file as cancelled.
        never_ran = [line for line in await client.batch_errors(job) if line["error"]["code"] == "batch_cancelled"]
        assert counts["total"] == 400 and counts["completed"] < 400 and never_ran, counts
        assert len(never_ran) + counts["completed"] <= 400 and {line["response"] for line in never_ran} == {None}


async def test_webhook_endpoints_are_added_listed_and_removed_by_an_admin(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str]
) -> None:
    url = f"http://127.0.0.1:9/client-{uuid.uuid4().hex}"  # allowed: the stack names 127.0.0.1
    async with AsyncClient(openai_stack.api_url, api_key=openai_keys["admin"]) as admin:
        added = await admin.add_webhook(url, ["task.completed", "batch.completed"], description="from the client")
        assert added["secret"].startswith("whsec_") and added["url"] == url
        listed = {endpoint["id"]: endpoint for endpoint in await admin.webhooks()}
        assert listed[added["id"]]["events"] == ["task.completed", "batch.completed"]
        assert "secret" not in listed[added["id"]]
        assert (await admin.remove_webhook(added["id"]))["deleted"] is True
        assert added["id"] not in {endpoint["id"] for endpoint in await admin.webhooks()}
        with pytest.raises(BrimfulError) as inward:
            await admin.add_webhook("http://10.0.0.1/hook", ["task.completed"])
        assert inward.value.status == 400 and inward.value.code == "invalid_url"
    async with AsyncClient(openai_stack.api_url, api_key=openai_keys["submit"]) as submitter:
        with pytest.raises(BrimfulError) as refused:
            await submitter.webhooks()
        assert refused.value.status == 403

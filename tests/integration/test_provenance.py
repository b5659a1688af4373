"""Where a task's time went, on the production-shape stack (auth on, two API workers, two
partitions, three models): each done task shows the batch and model call that computed it
and its stages, in ``GET /v1/tasks/{id}``, the long-poll's answer, the Python client and a
job's output lines; identical inputs and a failing row among them."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

import httpx
import orjson

from brimful.batcher.policy import FlushReason
from brimful.core.task_provenance import STAGES
from brimful.stack import EmbeddedStack
from brimful_client import AsyncClient
from tests.helpers.pipeline import expected_outputs

REASONS = {reason.value for reason in FlushReason}


async def endpoint_ids(http: httpx.AsyncClient) -> set[str]:
    """The endpoints' ids as /v1/stats names them, from every batcher of every model."""
    stats = (await http.get("/v1/stats")).json()
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if "url" in node and "id" in node:
                found.add(node["id"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(stats)
    return found


def check_shape(task: dict[str, Any], batch_size: int, endpoints: set[str]) -> dict[str, Any]:
    provenance = task["provenance"]
    assert len(provenance["batch_id"]) == 32 and provenance["partition"] in (0, 1)
    assert provenance["flush_reason"] in REASONS
    assert list(provenance["stages_ms"]) == list(STAGES) and min(provenance["stages_ms"].values()) >= 0
    if task["cached"] and provenance["model_calls"] == 0:  # answered with a result computed elsewhere
        assert (provenance["rows"], provenance["endpoint"]) == (0, "")
    else:
        assert 1 <= provenance["rows"] <= batch_size
        assert provenance["rows"] + provenance["padded_rows"] == batch_size
        assert provenance["endpoint"] in endpoints and provenance["model_calls"] >= 1
    # The stages cover the task's whole time, clamped only where two hosts' clocks disagree.
    assert sum(provenance["stages_ms"].values()) >= task["updated_at_ms"] - task["submitted_at_ms"] - 0.01
    return dict(provenance)


async def test_each_done_task_names_its_batch_call_and_stages_everywhere_it_is_read(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {openai_keys['submit']}"}
    run = uuid.uuid4().hex[:8]
    texts = [f"provenance {run} {n % 40}" for n in range(120)] + [f"!fail provenance {run}"]
    async with (
        httpx.AsyncClient(base_url=openai_stack.api_url, headers=headers, timeout=60) as http,
        AsyncClient(openai_stack.api_url, api_key=openai_keys["submit"]) as client,
    ):
        batch_size = next(m["batch_size"] for m in await client.models() if m["default"])
        endpoints = await endpoint_ids(http)
        assert endpoints and not any("127.0.0.1" in endpoint for endpoint in endpoints)

        async def long_poll(text: str) -> dict[str, Any]:
            answer = await http.post("/v1/tasks", params={"wait": "30"}, json={"inputs": {"TEXT": text}})
            assert answer.status_code in (200, 202), answer.text
            task: dict[str, Any] = answer.json()
            return task if answer.status_code == 200 else await client.status(task["task_id"], wait_s=30)

        held = await asyncio.gather(*(long_poll(text) for text in texts))
        failed = held.pop()
        assert failed["status"] == "failed" and "provenance" not in failed
        by_call: dict[tuple[str, int], set[str]] = defaultdict(set)
        for text, task in zip(texts, held):
            assert task["status"] == "done" and task["outputs"] == expected_outputs(text)
            from_poll = check_shape(task, batch_size, endpoints)
            read = (await http.get(f"/v1/tasks/{task['task_id']}")).json()
            assert read["provenance"] == from_poll  # the pushed answer and the stored record agree
            assert await client.provenance(task["task_id"]) == from_poll
            if not task["cached"]:
                by_call[(from_poll["batch_id"], from_poll["model_calls"])].add(task["task_id"])
        # A call's rows are at least the tasks that name it as their own (its twins say cached).
        rows = {(t["provenance"]["batch_id"], t["provenance"]["model_calls"]): t["provenance"]["rows"] for t in held}
        assert all(len(ids) <= rows[call] for call, ids in by_call.items())
        assert any(task["cached"] for task in held)  # 120 tasks over 40 texts: identical inputs shared


async def test_another_tenant_reads_no_provenance_and_a_job_s_lines_carry_it(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str]
) -> None:
    owner = {"Authorization": f"Bearer {openai_keys['submit']}"}
    stranger = {"Authorization": f"Bearer {openai_keys['other']}"}
    async with (
        httpx.AsyncClient(base_url=openai_stack.api_url, headers=owner, timeout=60) as http,
        AsyncClient(openai_stack.api_url, api_key=openai_keys["submit"]) as client,
    ):
        task_id = await client.submit({"TEXT": f"mine {uuid.uuid4().hex}"})
        assert (await client.status(task_id, wait_s=30))["status"] == "done"
        seen = await http.get(f"/v1/tasks/{task_id}", headers=stranger)
        assert seen.status_code == 404 and "provenance" not in seen.text
        texts = [f"job provenance {n}" for n in range(12)]
        lines = b"".join(
            orjson.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": t}}})
            + b"\n"
            for n, t in enumerate(texts)
        )
        job = await client.create_batch(lines, endpoint="/v1/tasks")
        ended = await client.wait_batch(job["id"], timeout_s=120, poll_s=0.2)
        assert ended["status"] == "completed", ended
        output = (await http.get(f"/v1/files/{ended['output_file_id']}/content")).content
        for raw in output.splitlines():
            body = orjson.loads(raw)["response"]["body"]
            assert body["provenance"]["batch_id"] and list(body["provenance"]["stages_ms"]) == list(STAGES)

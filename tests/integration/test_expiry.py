"""A task whose deadline passes before its batch runs is never computed: it reads
``expired`` with its reason, wakes its long-poll, is counted (``/v1/stats``, the batcher's
metric), frees its tenant's in-flight place, and the Python client raises for it; identical
tasks still in time, in the same moment and on both reference models, are computed as usual.

A ``deadline_ms`` of 1 cannot be met: the path through the broker to a batcher takes longer.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from brimful.stack import EmbeddedStack
from brimful_client import AsyncClient, TaskFailed
from tests.helpers.metrics import batcher_metrics_url, metric_values, model_stats
from tests.helpers.pipeline import expected_outputs
from tests.helpers.stacks import SMALL, rows_seen_by_model
from tests.helpers.task_client import TaskClient


async def test_a_task_past_its_deadline_is_never_computed_and_reads_expired(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    models = [stack.settings.model_name, SMALL]
    before = {model: (await model_stats(client, model))["tasks_expired"] for model in models}
    metric_before = {
        model: (await metric_values(batcher_metrics_url(stack, model) + "/metrics")).get(
            "brimful_tasks_expired_total", 0.0
        )
        for model in models
    }
    late_text = f"too late {uuid.uuid4().hex}"
    in_time_text = f"in time {uuid.uuid4().hex}"

    async def submit(text: str, model: str, deadline_ms: int) -> tuple[int, dict]:
        document = {"inputs": {"TEXT": text}, "model": model, "deadline_ms": deadline_ms}
        return await client.request("POST", "/v1/tasks?wait=20", json=document)

    # Per model: four that cannot make it and four identical tasks in time, sent together.
    answers = await asyncio.gather(
        *(submit(late_text, model, 1) for model in models for _ in range(4)),
        *(submit(in_time_text, model, 20_000) for model in models for _ in range(4)),
    )
    late, in_time = answers[:8], answers[8:]
    for status, body in late:
        assert status == 200 and body["status"] == "expired", body  # the long-poll woke for it
        assert body["error"]["class"] == "expired" and "not computed" in body["error"]["message"], body
        assert "outputs" not in body
    for status, body in in_time:
        assert status == 200 and body["status"] == "done", body
        assert body["outputs"] == expected_outputs(in_time_text)
    seen = rows_seen_by_model(stack)
    assert in_time_text in seen  # the log records what reached the model ...
    assert late_text not in seen  # ... and the expired tasks never did
    after = {model: (await model_stats(client, model))["tasks_expired"] for model in models}
    assert {model: after[model] - before[model] for model in models} == dict.fromkeys(models, 4)
    for model in models:
        metric = (await metric_values(batcher_metrics_url(stack, model) + "/metrics")).get(
            "brimful_tasks_expired_total", 0.0
        )
        assert metric - metric_before[model] == 4, model
    # Reading it later says the same.
    assert (await client.get(late[0][1]["task_id"]))["status"] == "expired"


async def test_the_python_client_raises_for_an_expired_task(stack: EmbeddedStack) -> None:
    async with AsyncClient(stack.api_url) as brimful:
        task_id = await brimful.submit({"TEXT": f"late again {uuid.uuid4().hex}"}, deadline_ms=1)
        with pytest.raises(TaskFailed) as failed:
            await brimful.result(task_id, timeout_s=20)
    assert failed.value.task["status"] == "expired"

"""Admission is per model: a model whose batchers are down piles up its own backlog and
refuses its own tasks (503 overloaded, with Retry-After), while every other model keeps
accepting and computing; once its batchers are back, it drains and accepts again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from brimful.commands.up import REFERENCE_MODELS
from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.stacks import start_wide_stack
from tests.helpers.task_client import TaskClient

MAX_BACKLOG = 200
SMALL = REFERENCE_MODELS.split(",")[1]


@pytest.fixture(scope="module")
def two_model_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_wide_stack(
        tmp_path_factory.mktemp("backlog-per-model"), models=REFERENCE_MODELS, max_backlog=MAX_BACKLOG
    )
    yield running
    running.stop()


async def test_one_models_backlog_refuses_only_that_models_tasks(two_model_stack: EmbeddedStack) -> None:
    stack = two_model_stack
    small_batcher = next(name for name in stack.processes if name.startswith(f"batcher-{SMALL}"))
    stack.processes[small_batcher].stop()
    tag = uuid.uuid4().hex
    async with TaskClient(stack.api_url) as client:
        tasks = [{"inputs": {"TEXT": f"piled up {tag} {n}"}, "model": SMALL} for n in range(300)]
        status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": tasks})
        assert status == 200, body
        piled = [r["task_id"] for r in body["results"] if "task_id" in r]
        assert len(piled) > MAX_BACKLOG
        refused = [r["error"] for r in body["results"] if "error" in r]
        assert all(error["code"] == "overloaded" and SMALL in error["message"] for error in refused), refused

        status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "one more"}, "model": SMALL})
        assert status == 503 and body["error"]["code"] == "overloaded", body
        # The other model is untouched by it.
        for n in range(5):
            status, body = await client.request(
                "POST", "/v1/tasks?wait=10", json={"inputs": {"TEXT": f"other {tag} {n}"}}
            )
            assert status == 200 and body["status"] == "done", body

        stack.start_batcher(small_batcher)
        for task_id in piled:
            assert (await client.wait_final(task_id, timeout_s=60))["status"] == "done"

        async def small_accepts() -> bool:
            status, _ = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "drained"}, "model": SMALL})
            return status == 202

        await wait_for(small_accepts, 30, "the drained model to accept again")

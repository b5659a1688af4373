"""Identical tasks computed once, in the production shape: several partitions, several
endpoints, a failing row with many copies. A batch that waits for a row another batch
computes must never hold the slot that batch needs to retry (the model would deadlock
for good, with every later task of it queued)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for
from tests.helpers.stacks import start_wide_stack
from tests.helpers.task_client import TaskClient


@pytest.fixture(scope="module")
def wide_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    # A slow retry: the failing row's batch is between its calls while its copies arrive.
    running = start_wide_stack(
        tmp_path_factory.mktemp("wide-stack"), retry_backoff_ms=1500.0, retry_backoff_max_ms=3000.0
    )
    yield running
    running.stop()


async def test_copies_of_a_failing_row_waiting_on_it_do_not_deadlock_the_model(wide_stack: EmbeddedStack) -> None:
    text = f"!fail copied {uuid.uuid4().hex}"
    async with TaskClient(wide_stack.api_url) as client:
        status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": [{"inputs": {"TEXT": text}}] * 2})
        assert status == 200 and body["accepted"] == 2, body
        first = [task["task_id"] for task in body["results"]]

        async def leading_row_at_the_model() -> bool:
            return any([(await client.get(task_id))["status"] != "queued" for task_id in first])

        await wait_for(leading_row_at_the_model, 20, "the failing row's batch to run", interval_s=0.01)
        # One at a time: each its own group, so the copies reach every partition.
        copies = [await client.submit({"TEXT": text}) for _ in range(50)]
        # Every copy fails as the row does (each with its dead letter), and the model still
        # serves: a task sent after them is computed.
        answers = [await client.wait_final(task_id, timeout_s=60) for task_id in first + copies]
        assert [a["status"] for a in answers] == ["failed"] * 52
        later = await client.submit({"TEXT": f"after the copies {uuid.uuid4().hex}"})
        assert (await client.wait_final(later, timeout_s=20))["status"] == "done"
        status, letters = await client.request("GET", "/v1/admin/dlq?ids=" + ",".join(copies[:10]))
        assert status == 200 and {e["task_id"] for e in letters["entries"]} == set(copies[:10]), letters

"""Identical tasks are computed once, on the real stack: a repeated task is answered from
the batcher's cache, identical tasks in one batch share one computed row (its result, or
its failure), and a task that opts out gets its own model call. (That a cached result
never crosses tenants is in test_auth.py, on a stack with keys.)"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.metrics import model_stats, triton_counts
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import SMALL, fault_file
from tests.helpers.task_client import TaskClient


async def ask(client: TaskClient, text: str, **fields: Any) -> dict[str, Any]:
    status, body = await client.request("POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": text}, **fields})
    assert status == 200 and body["status"] in ("done", "failed"), body
    return body


async def wait_running(client: TaskClient, task_id: str) -> None:
    async def running() -> bool:
        return (await client.get(task_id))["status"] == "running"

    await wait_for(running, 20, f"task {task_id} to reach the model", interval_s=0.01)


async def test_a_repeated_task_is_answered_from_the_cache_without_a_model_call(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    text = f"asked twice {uuid.uuid4().hex}"
    first = await ask(client, text)
    assert first["cached"] is False and first["outputs"] == expected_outputs(text)
    before, triton_before = await client.stats(), await triton_counts(stack, stack.settings.model_name)
    second = await ask(client, text)
    assert second["cached"] is True and second["outputs"] == first["outputs"]
    assert (await client.get(second["task_id"]))["cached"] is True  # read back from the store too
    after = await client.stats()
    assert after["cache_hits"] == before["cache_hits"] + 1
    assert after["rows_dispatched"] == before["rows_dispatched"]
    assert await triton_counts(stack, stack.settings.model_name) == triton_before


async def test_a_task_that_opts_out_gets_its_own_model_call(stack: EmbeddedStack, client: TaskClient) -> None:
    text = f"opted out {uuid.uuid4().hex}"
    await ask(client, text)  # now cached
    before = await client.stats()
    fresh = await ask(client, text, cache=False)
    assert fresh["cached"] is False and fresh["outputs"] == expected_outputs(text)
    after = await client.stats()
    assert after["rows_dispatched"] == before["rows_dispatched"] + 1
    assert (after["cache_hits"], after["cache_misses"]) == (before["cache_hits"], before["cache_misses"])
    status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}, "cache": "no"})
    assert status == 422 and "cache" in body["error"]["message"], body


async def test_a_model_marked_uncacheable_computes_every_task(stack: EmbeddedStack, client: TaskClient) -> None:
    assert SMALL in stack.settings.uncacheable_models  # the shared stack marks it so
    text = f"not deterministic {uuid.uuid4().hex}"
    before = await model_stats(client, SMALL)
    answers = [await ask(client, text, model=SMALL) for _ in range(2)]
    answers += await asyncio.gather(*(ask(client, text, model=SMALL) for _ in range(3)))
    assert [a["cached"] for a in answers] == [False] * 5
    assert all(a["outputs"] == expected_outputs(text) for a in answers)
    after = await model_stats(client, SMALL)
    assert after["rows_dispatched"] - before["rows_dispatched"] == 5
    assert (after["cache_hits"], after["cache_misses"]) == (before["cache_hits"], before["cache_misses"])


async def test_identical_tasks_in_one_batch_are_computed_once(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # The cost mode with a floor on the wait, so the identical tasks sent together wait in
    # one batch even while the arrival rate the policy estimates says none will follow.
    await tune_live(client, min_wait_ms=1000, max_wait_ms=2000, latency_target_ms=2000)
    text, other = f"asked six times at once {uuid.uuid4().hex}", f"asked once {uuid.uuid4().hex}"
    before = await client.stats()
    answers = await asyncio.gather(*(ask(client, t) for t in [text] * 6 + [other]))
    assert all(a["status"] == "done" for a in answers), answers
    assert all(a["outputs"] == expected_outputs(text) for a in answers[:6])
    assert sorted(a["cached"] for a in answers[:6]) == [False] + [True] * 5
    assert answers[6]["cached"] is False and answers[6]["outputs"] == expected_outputs(other)
    after = await client.stats()
    assert after["rows_dispatched"] - before["rows_dispatched"] == 2
    assert after["batches_dispatched"] - before["batches_dispatched"] == 1
    assert (after["cache_hits"] - before["cache_hits"], after["cache_misses"] - before["cache_misses"]) == (5, 2)


async def test_a_task_identical_to_one_another_batch_is_computing_waits_for_that_row(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    # The first copy holds its model call for seconds (the reference model's !hang-once
    # hook), so a copy sent once the first runs leaves in a later batch while the first is
    # still at the model. It must take the first copy's row, not compute its own.
    text = f"!hang-once computed once {uuid.uuid4().hex}"
    before = await client.stats()
    first = await client.submit({"TEXT": text})
    await wait_running(client, first)
    second = await client.submit({"TEXT": text})
    answers = [await client.wait_final(task_id) for task_id in (first, second)]
    assert [a["status"] for a in answers] == ["done", "done"], answers
    assert all(a["outputs"] == expected_outputs(text) for a in answers)
    assert [a["cached"] for a in answers] == [False, True]
    after = await client.stats()
    assert after["rows_dispatched"] - before["rows_dispatched"] == 1
    flushed = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("flushes_"))
    assert flushed == 2  # two batches, one row at the model


async def test_a_task_whose_awaited_row_fails_is_computed_in_its_own_batch(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # A batch of a hanging row and a '!flaky' row (the fault on) holds the model for
    # seconds, then its flaky row fails; an identical task sent meanwhile waits for that
    # row and, as a failure is not shared beyond its batch, is then computed in its own
    # batch (failing there too, with its own dead letter) instead of waiting forever.
    # (That such a task waits rather than computes is the test above.)
    tag = uuid.uuid4().hex
    flaky_text = f"!flaky computed twice {tag}"
    switch = fault_file(stack)
    switch.touch()
    try:
        # So the first two share a batch.
        await tune_live(client, min_wait_ms=1000, max_wait_ms=2000, latency_target_ms=2000)
        hanging, flaky = [await client.submit({"TEXT": text}) for text in (f"!hang-once {tag}", flaky_text)]
        await wait_running(client, flaky)
        settings = stack.settings
        await tune_live(
            client,
            min_wait_ms=settings.min_wait_ms,
            max_wait_ms=settings.max_wait_ms,
            latency_target_ms=settings.latency_target_ms,
        )
        twin = await client.submit({"TEXT": flaky_text})
        answers = [await client.wait_final(task_id) for task_id in (hanging, flaky, twin)]
    finally:
        switch.unlink()
    assert [a["status"] for a in answers] == ["done", "failed", "failed"], answers
    assert answers[2]["error"]["attempts"] == stack.settings.max_attempts  # its own calls, not a copy
    status, entry = await client.request("GET", f"/v1/admin/dlq?ids={twin}")
    assert status == 200 and len(entry["entries"]) == 1, entry


async def test_identical_tasks_share_a_failure_and_each_has_its_dead_letter(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    await tune_live(client, min_wait_ms=1000, max_wait_ms=2000, latency_target_ms=2000)
    text = f"!fail the same way {uuid.uuid4().hex}"
    answers = await asyncio.gather(*(ask(client, text) for _ in range(3)))
    assert [a["status"] for a in answers] == ["failed"] * 3, answers
    assert {a["error"]["class"] for a in answers} == {"model_error"}
    for answer in answers:
        status, entry = await client.request("GET", f"/v1/admin/dlq?ids={answer['task_id']}")
        assert status == 200 and len(entry["entries"]) == 1, entry
        # Nothing of the failure is cached: the same input is computed (and fails) again.
    again = await ask(client, text)
    assert again["status"] == "failed"

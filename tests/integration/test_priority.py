"""Low-priority tasks on the real stack: they fill the slots a normal batch would pad,
take idle slots in batches of their own, and drain while normal traffic flows, with the
normal tasks answered first."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.pipeline import expected_outputs
from tests.helpers.task_client import TaskClient


async def submit(client: TaskClient, text: str, priority: str | None = None) -> str:
    body: dict[str, Any] = {"inputs": {"TEXT": text}, "cache": False}
    if priority is not None:
        body["priority"] = priority
    status, answer = await client.request("POST", "/v1/tasks", json=body)
    assert status == 202, answer
    return answer["task_id"]


async def test_low_priority_rows_fill_the_slots_a_normal_batch_would_pad(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # The cost mode, waiting whatever the rate: the normal batch waits (up to 1.5 s) while
    # the low rows arrive.
    await tune_live(client, max_wait_ms=1500, latency_target_ms=1500, min_worthwhile_rows=0)
    tag = uuid.uuid4().hex
    before = await client.stats()
    normal = [await submit(client, f"normal {i} {tag}") for i in range(3)]
    low = await asyncio.gather(*(submit(client, f"low {i} {tag}", "low") for i in range(40)))
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=30) for t in normal + list(low)))
    assert all(r["status"] == "done" for r in results), results
    texts = [f"normal {i} {tag}" for i in range(3)] + [f"low {i} {tag}" for i in range(40)]
    assert [r["outputs"] for r in results] == [expected_outputs(t) for t in texts]
    after = await client.stats()
    # One call carried all 43: the 40 low rows took slots that would have been padding.
    assert after["batches_dispatched"] - before["batches_dispatched"] == 1
    assert after["rows_dispatched"] - before["rows_dispatched"] == 43
    assert after["padded_slots"] - before["padded_slots"] == 64 - 43
    assert after.get("flushes_backfill", 0) == before.get("flushes_backfill", 0)


async def test_low_priority_rows_take_an_idle_model_in_batches_of_their_own(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    tag = uuid.uuid4().hex
    before = await client.stats()
    low = await asyncio.gather(*(submit(client, f"bulk {i} {tag}", "low") for i in range(100)))
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=30) for t in low))
    assert all(r["status"] == "done" for r in results)
    after = await client.stats()
    assert after["rows_dispatched"] - before["rows_dispatched"] == 100
    assert after.get("flushes_backfill", 0) > before.get("flushes_backfill", 0)


async def test_a_bulk_backlog_drains_while_normal_tasks_flow_ahead_of_it(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    tag = uuid.uuid4().hex
    low = await asyncio.gather(*(submit(client, f"backlog {i} {tag}", "low") for i in range(600)))
    normal_waits: list[float] = []

    async def one_normal(index: int) -> None:
        started = time.monotonic()
        status, body = await client.request(
            "POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": f"stream {index} {tag}"}, "cache": False}
        )
        assert status == 200 and body["status"] == "done", body
        normal_waits.append(time.monotonic() - started)

    # A normal stream of about 50 a second while the backlog is there.
    stream = []
    for index in range(50):
        stream.append(asyncio.create_task(one_normal(index)))
        await asyncio.sleep(0.02)
    await asyncio.gather(*stream)
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=60, interval_s=0.1) for t in low))
    assert all(r["status"] == "done" for r in results)
    # Normal tasks were not queued behind 600 bulk rows: each finished within a few calls.
    assert max(normal_waits) < 5.0, sorted(normal_waits)[-5:]
    status, bad = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "x"}, "priority": "urgent"})
    assert status == 422 and "priority" in bad["error"]["message"], bad


async def test_low_priority_rows_never_starve_they_queue_as_normal_after_their_bound(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # Neither way out for low rows: a normal row waits (up to 20 s, whatever the rate), so
    # no slot is idle for a backfill, and that batch will not leave to be topped up.
    await tune_live(client, max_wait_ms=20000, latency_target_ms=20000, min_worthwhile_rows=0, low_max_wait_ms=300)
    tag = uuid.uuid4().hex
    held = await submit(client, f"held normal {tag}")
    low = await asyncio.gather(*(submit(client, f"starving {i} {tag}", "low") for i in range(64)))
    started = time.monotonic()
    # After 300 ms they queue as normal rows: with the one waiting, a full batch leaves.
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=10) for t in low))
    assert all(r["status"] == "done" for r in results), results
    assert time.monotonic() - started < 10  # far inside the 20 s the normal batch would have held them
    assert (await client.get(held))["status"] == "queued"  # the normal row still fills its own batch

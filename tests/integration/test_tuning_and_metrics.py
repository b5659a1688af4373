"""Live policy tuning, per-request deadlines, metrics and trace recording on a running stack."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from brimful.batcher.traces import read_trace
from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import policy_seen_by_batchers, tune, tune_live
from tests.helpers.metrics import metric_values
from tests.helpers.polling import wait_for
from tests.helpers.task_client import TaskClient


async def latency_ms(client: TaskClient, text: str, **extra: Any) -> float:
    status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}, **extra})
    assert status == 202, body
    task = await client.wait_final(body["task_id"], interval_s=0.005)
    assert task["status"] == "done"
    return float(task["updated_at_ms"] - task["submitted_at_ms"])


async def test_max_wait_changed_live_reaches_batchers_within_2s_and_loses_nothing(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # Steady trickle throughout, so the change lands while batches are filling.
    trickle: list[str] = []

    async def keep_submitting(stop: asyncio.Event) -> None:
        while not stop.is_set():
            trickle.append(await client.submit({"TEXT": f"during tuning {len(trickle)}"}))
            await asyncio.sleep(0.05)

    stop = asyncio.Event()
    background = asyncio.create_task(keep_submitting(stop))
    try:
        assert await latency_ms(client, "before") < 200
        changed_at = time.monotonic()
        status, body = await tune(client, min_wait_ms=1200, max_wait_ms=1200)
        assert status == 200, body
        assert body["old"]["max_wait_ms"] == stack.settings.max_wait_ms and body["new"]["max_wait_ms"] == 1200
        while any(p["max_wait"] != 1.2 for p in await policy_seen_by_batchers(client)):
            assert time.monotonic() - changed_at < 2.0, "a batcher did not take the change within 2 s"
            await asyncio.sleep(0.02)
        # The new behaviour: a lone request now waits for the 1.2 s deadline.
        stop.set()
        await background
        assert await latency_ms(client, "after") >= 1100
    finally:
        stop.set()
        await background
    results = await asyncio.gather(*(client.wait_final(t) for t in trickle))
    assert all(r["status"] == "done" for r in results)


async def test_impossible_values_are_refused_with_a_reason(client: TaskClient) -> None:
    status, body = await tune(client, min_wait_ms=500, max_wait_ms=100)
    assert status == 422 and "min_wait" in body["error"]["message"]
    status, body = await tune(client, batch_size=32)
    assert status == 422 and "unknown parameter" in body["error"]["message"]
    status, body = await client.request("PATCH", "/v1/admin/policy", json={"max_wait_ms": "soon"})
    assert status == 422 and "must be a number" in body["error"]["message"]
    status, body = await client.request("PATCH", "/v1/admin/policy", data=b"[1]")
    assert status == 422


async def test_tuned_values_survive_a_batcher_restart_and_are_logged(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    status, _ = await tune(client, max_wait_ms=180)
    assert status == 200
    name = next(n for n in stack.processes if n.startswith("batcher"))
    stack.processes.pop(name).stop()
    stack.start_batcher()
    await asyncio.to_thread(stack.wait_for_batchers)

    async def tuned() -> bool:
        return [p["max_wait"] for p in await policy_seen_by_batchers(client)] == [0.18]

    await wait_for(tuned, 30, "the restarted batcher to report the tuned policy")
    assert await latency_ms(client, "after restart") < 1000
    status, state = await client.request("GET", "/v1/admin/policy")
    assert state["params"]["max_wait_ms"] == 180
    assert state["history"][0]["new"]["max_wait_ms"] == 180
    log_lines = [
        json.loads(line)
        for line in (stack.workdir / "logs" / "api.log").read_text().splitlines()
        if '"policy changed"' in line
    ]
    assert any("max_wait_ms" in entry["changes"] and "-> 180" in entry["changes"]["max_wait_ms"] for entry in log_lines)


async def test_request_deadline_flushes_before_the_policy_would(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    await tune_live(client, min_wait_ms=3000, max_wait_ms=3000)
    before = (await client.stats()).get("flushes_request_deadline", 0)
    assert await latency_ms(client, "in a hurry", deadline_ms=400) < 1000
    assert (await client.stats())["flushes_request_deadline"] == before + 1


async def test_metrics_add_up_after_traffic(stack: EmbeddedStack, client: TaskClient) -> None:
    batcher_url = f"http://127.0.0.1:{stack.settings.batcher_metrics_port}/metrics"
    api_url = f"{stack.api_url}/metrics"
    before, api_before, stats_before = (
        await metric_values(batcher_url),
        await metric_values(api_url),
        await client.stats(),
    )
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"metrics {i}"}) for i in range(300)))
    await asyncio.gather(*(client.wait_final(t, interval_s=0.1) for t in task_ids))
    after, api_after, stats_after = await metric_values(batcher_url), await metric_values(api_url), await client.stats()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches = stats_after["batches_dispatched"] - stats_before["batches_dispatched"]
    rows = stats_after["rows_dispatched"] - stats_before["rows_dispatched"]
    assert rows == 300
    assert delta("brimful_batch_rows_sum") == rows
    assert delta("brimful_batch_rows_count") == batches
    assert delta("brimful_padded_slots_total") == batches * 64 - rows
    assert delta("brimful_flushes_total") == batches
    assert delta("brimful_queue_wait_seconds_count") == rows
    assert delta("brimful_task_latency_seconds_count") == rows
    assert delta("brimful_model_calls_total") == batches
    assert api_after["brimful_tasks_submitted_total"] - api_before.get("brimful_tasks_submitted_total", 0) == 300
    assert delta("brimful_endpoint_rows_total") == rows
    for gauge in ("brimful_arrival_rate_per_second", "brimful_flush_deadline_seconds", "brimful_batches_in_flight"):
        assert gauge in after, f"{gauge} missing"
    # Each endpoint of the pool: its slots, fitted call time and closed circuit.
    assert after["brimful_endpoint_capacity"] == stack.settings.endpoint_capacity * len(stack.settings.triton_endpoints)
    assert after["brimful_endpoint_call_seconds"] > 0
    assert after["brimful_endpoint_breaker_state"] == 0


async def test_batchers_record_arrival_traces_the_simulator_can_read(stack: EmbeddedStack, client: TaskClient) -> None:
    started = time.time()
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"traced {i}"}) for i in range(40)))
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    directory = stack.workdir / "traces"
    deadline = time.monotonic() + 15  # recorders flush every 5 s
    while True:
        recent = 0
        if directory.exists() and any(directory.glob("*.parquet")):
            trace = read_trace(directory)
            recent = sum(1 for times in trace.values() for t in times if t >= started - 1)
        if recent >= 40:
            break
        assert time.monotonic() < deadline, f"only {recent} of 40 arrivals recorded"
        await asyncio.sleep(0.2)

"""What on-call reads: the batcher's probes and status, and the metrics that answer
"what was refused, what failed, how far behind are we", on the real embedded stack."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from brimful.batcher.health_server import MAX_CONNECTIONS
from brimful.stack import EmbeddedStack
from tests.helpers.metrics import Samples, scrape, value
from tests.helpers.polling import wait_for
from tests.helpers.stacks import fault_file
from tests.helpers.task_client import TaskClient


def batcher_url(stack: EmbeddedStack, path: str) -> str:
    return f"http://127.0.0.1:{stack.settings.batcher_metrics_port}{path}"


async def scrape_batcher(stack: EmbeddedStack) -> Samples:
    """The default model's batcher's samples, less the ``model`` label each one carries."""
    model = stack.settings.model_name
    samples = await scrape(batcher_url(stack, "/metrics"))
    assert samples and all(dict(labels).get("model") == model for _, labels in samples), "a sample lacks the model"
    return {(name, frozenset(kv for kv in labels if kv[0] != "model")): v for (name, labels), v in samples.items()}


async def get(url: str, method: str = "GET") -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.request(method, url) as response:
        return response.status, await response.json(content_type=None)


async def test_the_batcher_answers_its_probes_and_names_its_partitions_and_endpoints(stack: EmbeddedStack) -> None:
    health: dict[str, Any] = {}

    async def fetched() -> bool:  # None until its first fetch comes back (it may still be joining the group)
        status, answer = await get(batcher_url(stack, "/healthz"))
        assert status == 200 and isinstance(answer, dict) and answer["alive"] is True
        health.update(answer)
        return answer["seconds_since_fetch"] is not None

    await wait_for(fetched, 30, "the batcher's first fetch")
    assert 0 <= health["seconds_since_fetch"] < 5
    status, ready = await get(batcher_url(stack, "/readyz"))
    assert (status, ready) == (200, {"ready": True})
    status, detail = await get(batcher_url(stack, "/status"))
    assert status == 200
    assert set(detail["partitions"]) == {str(p) for p in range(stack.settings.topic_partitions)}
    endpoints = detail["endpoints"]
    assert {e["url"] for e in endpoints} == set(stack.settings.triton_endpoints)
    assert all(e["breaker"] == "closed" for e in endpoints)
    assert 0 <= detail["upstream_estimate_s"] < 1  # submit-to-fetch, measured from the rows it read
    # What the policy counts around a batch (for `brimful simulate --around-ms`): that hop and more.
    assert detail["upstream_estimate_s"] <= detail["pool"]["around_call_s"] < 2
    assert (await get(batcher_url(stack, "/nowhere")))[0] == 404
    assert (await get(batcher_url(stack, "/healthz"), method="POST"))[0] == 405


async def test_the_batcher_server_drops_an_oversized_request_head(stack: EmbeddedStack) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.settings.batcher_metrics_port)
    writer.write(b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 20_000 + b"\r\n\r\n")
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    assert reply == b""  # closed without an answer, and the server still serves
    assert (await get(batcher_url(stack, "/healthz")))[0] == 200


async def test_sockets_that_send_nothing_never_keep_a_probe_out(stack: EmbeddedStack) -> None:
    port = stack.settings.batcher_metrics_port
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        await asyncio.sleep(0.2)  # all accepted: each holds a place until its head would time out
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert (await asyncio.wait_for(get_text(batcher_url(stack, probe)), timeout=5)) == 200, probe
    finally:
        for _, writer in idle:
            writer.close()


async def get_text(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.read()
        return response.status


async def test_api_and_batcher_keep_their_startup_heap_out_of_full_collections(stack: EmbeddedStack) -> None:
    # The batcher freezes once it consumes, which may follow its first scrape: poll.
    deadline = time.monotonic() + 30
    readers = {"API": lambda: scrape(f"{stack.api_url}/metrics"), "batcher": lambda: scrape_batcher(stack)}
    for process, read in readers.items():
        while (frozen := value(await read(), "brimful_gc_frozen_objects")) == 0:
            assert time.monotonic() < deadline, f"{process}: nothing frozen"
            await asyncio.sleep(0.1)
        assert frozen > 10_000, f"{process}: only {frozen} objects frozen"  # start-up holds ~100,000


async def test_answers_are_counted_by_route_template_and_refusals_by_reason(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    api_metrics = f"{stack.api_url}/metrics"
    before = await scrape(api_metrics)
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"counted {i}"}) for i in range(20)))
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    made_up = [f"/no/such/path/{i}" for i in range(5)]
    for path in made_up:
        assert (await client.request("GET", path))[0] == 404
    status, _ = await client.request(
        "POST",
        "/v1/tasks",
        data=b"x" * (stack.settings.max_body_bytes + 1),
        headers={"Content-Type": "application/json"},
    )
    assert status == 413
    after = await scrape(api_metrics)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("brimful_http_responses_total", route="/v1/tasks", status="202") == 20
    assert delta("brimful_http_responses_total", route="/v1/tasks/{task_id}", status="200") >= 20
    assert delta("brimful_http_responses_total", route="unmatched", status="404") == 5
    assert not any(path in str(labels) for (_, labels) in after for path in made_up), "a raw path became a label"
    assert delta("brimful_http_responses_total", route="/v1/tasks", status="413") == 1
    assert delta("brimful_refusals_total", reason="body_too_large") == 1
    assert value(after, "brimful_backlog_limit_rows") == stack.settings.max_backlog


async def test_lag_settles_to_zero_once_the_work_is_done(stack: EmbeddedStack, client: TaskClient) -> None:
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"lag {i}"}) for i in range(100)))
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    deadline = time.monotonic() + 15  # offsets commit and the gauges refresh in the background
    while True:
        samples = await scrape_batcher(stack)
        lag_rows = {
            dict(labels)["partition"]: v for (name, labels), v in samples.items() if name == "brimful_consumer_lag_rows"
        }
        lag_s = [v for (name, _), v in samples.items() if name == "brimful_consumer_lag_seconds"]
        if len(lag_rows) == stack.settings.topic_partitions and not any(lag_rows.values()) and not any(lag_s):
            break
        assert time.monotonic() < deadline, f"lag never settled: rows {lag_rows}, seconds {lag_s}"
        await asyncio.sleep(0.2)
    assert value(samples, "brimful_batcher_assigned_partitions") == stack.settings.topic_partitions


async def test_dead_letters_and_retries_are_counted_by_class(stack: EmbeddedStack, client: TaskClient) -> None:
    before = await scrape_batcher(stack)
    switch = fault_file(stack)
    switch.touch()  # the model now fails '!flaky' rows
    try:
        task_id = await client.submit({"TEXT": "!flaky counted"})
        assert (await client.wait_final(task_id))["status"] == "failed"
    finally:
        switch.unlink()
    after = await scrape_batcher(stack)
    lettered = value(after, "brimful_dead_letters_total", error_class="model_error") - value(
        before, "brimful_dead_letters_total", error_class="model_error"
    )
    assert lettered == 1
    retried = value(after, "brimful_model_retries_total", kind="model_error") - value(
        before, "brimful_model_retries_total", kind="model_error"
    )
    assert retried >= stack.settings.max_attempts - 1


async def test_each_batch_is_split_into_its_stages(stack: EmbeddedStack, client: TaskClient) -> None:
    stages = ("to_batcher", "in_batch", "prepare", "call", "store")

    def per_stage(samples: Samples, suffix: str) -> dict[str, float]:
        return {stage: value(samples, f"brimful_batch_stage_seconds_{suffix}", stage=stage) for stage in stages}

    before = await scrape_batcher(stack)
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"stages {i}"}) for i in range(40)))
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    after = await scrape_batcher(stack)

    def calls(samples: Samples) -> float:  # summed over partitions
        return sum(v for (name, _), v in samples.items() if name == "brimful_batch_rows_count")

    batches = calls(after) - calls(before)
    counts = {k: v - per_stage(before, "count")[k] for k, v in per_stage(after, "count").items()}
    sums = {k: v - per_stage(before, "sum")[k] for k, v in per_stage(after, "sum").items()}
    assert batches >= 1
    assert counts == dict.fromkeys(stages, batches), "every batch of clean rows is seen once at every stage"
    means = {stage: sums[stage] / batches for stage in stages}
    latency = (value(after, "brimful_task_latency_seconds_sum") - value(before, "brimful_task_latency_seconds_sum")) / (
        value(after, "brimful_task_latency_seconds_count") - value(before, "brimful_task_latency_seconds_count")
    )
    # In seconds, each a part of the submit-to-result time; together about all of it (the
    # stages are means over batches, the latency a mean over rows).
    assert all(0 <= mean < latency for mean in means.values()), (means, latency)
    assert means["call"] > 0 and means["to_batcher"] > 0
    assert 0.5 * latency < sum(means.values()) < 1.5 * latency, (means, latency)

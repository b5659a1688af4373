"""A task's trace across the real processes: the API and the batcher of an embedded stack
export spans over OTLP/HTTP to a receiver here; the caller's trace context must reach the
batcher through the Kafka record's headers and join every span into one trace."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.otlp_receiver import ReceivedSpan, Spans, running_otlp_receiver
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient

SPAN_NAMES = {"brimful.accept", "brimful.enqueue", "brimful.wait_in_batch", "brimful.model_call", "brimful.store"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[str, Spans]]:
    with running_otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory: pytest.TempPathFactory, receiver: tuple[str, Spans]) -> Iterator[EmbeddedStack]:
    workdir: Path = tmp_path_factory.mktemp("traced")
    stack = start_stack(workdir, stack_settings(tracing_enabled=True, tracing_otlp_endpoint=receiver[0]))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def traced_client(traced_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(traced_stack.api_url) as client:
        yield client


async def spans_of(spans: Spans, trace_id: str, names: set[str], timeout_s: float = 30) -> dict[str, ReceivedSpan]:
    """The trace's spans by name, once all of ``names`` arrived (exporters send in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {span.name: span for span in spans.of_trace(trace_id)}
        if names <= set(found):
            return found
        assert time.monotonic() < deadline, f"spans of {trace_id}: only {sorted(found)}"
        await asyncio.sleep(0.2)


async def test_the_callers_trace_runs_through_kafka_to_the_model_call(
    traced_client: TaskClient, receiver: tuple[str, Spans]
) -> None:
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    status, body = await traced_client.request(
        "POST",
        "/v1/tasks",
        json={"inputs": {"TEXT": "traced"}},
        headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
    )
    assert status == 202, body
    assert (await traced_client.wait_final(body["task_id"]))["status"] == "done"

    found = await spans_of(receiver[1], trace_id, SPAN_NAMES)
    accept, enqueue = found["brimful.accept"], found["brimful.enqueue"]
    assert accept.service == "brimful-api" and accept.parent_span_id == caller_span
    assert enqueue.parent_span_id == accept.span_id
    assert enqueue.attributes["brimful.task_id"] == body["task_id"]
    batcher_spans = [found[name] for name in ("brimful.wait_in_batch", "brimful.model_call", "brimful.store")]
    for span in batcher_spans:  # in the batcher's process, children of what the record carried
        assert span.service == "brimful-batcher"
        assert span.parent_span_id == enqueue.span_id
        assert span.attributes["brimful.task_id"] == body["task_id"]
    assert len({span.attributes["brimful.batch_id"] for span in batcher_spans}) == 1
    wait, call, store = batcher_spans
    assert wait.attributes["brimful.flush_reason"]
    assert call.attributes["brimful.rows"] >= 1
    # In order on the wall clock: accepted, waited, called, stored.
    assert accept.start_ns <= enqueue.start_ns <= wait.start_ns <= wait.end_ns <= call.start_ns
    assert call.end_ns <= store.end_ns


async def test_tasks_without_trace_context_get_traces_of_their_own(
    traced_client: TaskClient, receiver: tuple[str, Spans]
) -> None:
    task_ids = await asyncio.gather(*(traced_client.submit({"TEXT": f"untraced {i}"}) for i in range(3)))
    await asyncio.gather(*(traced_client.wait_final(t) for t in task_ids))

    def enqueue_spans() -> dict[str, ReceivedSpan]:
        return {s.attributes["brimful.task_id"]: s for s in receiver[1].all() if s.name == "brimful.enqueue"}

    await wait_for(lambda: set(task_ids) <= set(enqueue_spans()), 30, "the enqueue spans", interval_s=0.2)
    enqueued = enqueue_spans()
    traces = {enqueued[t].trace_id for t in task_ids}
    assert len(traces) == 3  # one trace a task
    for task_id in task_ids:
        found = await spans_of(receiver[1], enqueued[task_id].trace_id, SPAN_NAMES)
        assert found["brimful.accept"].parent_span_id == ""
        assert found["brimful.model_call"].attributes["brimful.task_id"] == task_id

"""Brimful's spans, recorded by the OpenTelemetry SDK's in-memory exporter: the caller's
trace continues through accept and enqueue, the Kafka headers carry it, and the batcher's
spans of a batch join each task's own trace with the batch's id and flush reason."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from brimful.core.settings import Settings
from brimful.core.tracing import BatchTrace, TracedTask, Tracing, configure_tracing

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}


def traced() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(Settings(tracing_enabled=True), "test", exporter)
    assert tracing is not None
    return tracing, exporter


def test_tracing_is_off_by_default() -> None:
    assert configure_tracing(Settings(), "test", InMemorySpanExporter()) is None


def test_accept_and_enqueue_continue_the_callers_trace_and_the_headers_carry_enqueue() -> None:
    tracing, exporter = traced()
    with tracing.server_span("brimful.accept", CALLER):
        with tracing.producer_span("brimful.enqueue", **{"brimful.task_id": "t1"}) as headers:
            pass
    spans = {span.name: span for span in exporter.get_finished_spans()}
    accept, enqueue = spans["brimful.accept"], spans["brimful.enqueue"]
    assert format(accept.context.trace_id, "032x") == CALLER_TRACE
    assert format(accept.parent.span_id, "016x") == CALLER_SPAN
    assert enqueue.parent.span_id == accept.context.span_id
    assert enqueue.attributes["brimful.task_id"] == "t1"
    ((name, value),) = headers
    assert name == "traceparent"
    assert value.decode() == f"00-{CALLER_TRACE}-{enqueue.context.span_id:016x}-01"


def test_a_request_without_trace_context_starts_a_trace_of_its_own() -> None:
    tracing, exporter = traced()
    with tracing.server_span("brimful.accept", {}):
        pass
    (accept,) = exporter.get_finished_spans()
    assert accept.parent is None and format(accept.context.trace_id, "032x") != CALLER_TRACE


def test_a_batch_gives_each_traced_task_its_wait_call_and_store_spans() -> None:
    tracing, exporter = traced()
    tasks = [
        TracedTask(f"task-{i}", [("traceparent", f"00-{trace:032x}-{span:016x}-01".encode())], 1_000 + i)
        for i, (trace, span) in enumerate([(0xA1, 0xB1), (0xA2, 0xB2)])
    ]
    junk = TracedTask("untraced", [("traceparent", b"not a trace context")], 1_000)
    batch = BatchTrace(
        batch_id="b" * 32,
        flush_reason="slot_free",
        partition=3,
        flushed_ns=2_000,
        call_started_ns=2_100,
        call_ended_ns=3_000,
        stored_ns=3_500,
        endpoint="127.0.0.1:8001",
        rows=3,
        calls=1,
    )
    tracing.record_batch(batch, [*tasks, junk])
    spans = exporter.get_finished_spans()
    assert len(spans) == 6  # three per traced task, none for the junk header
    for task, (trace, span) in zip(tasks, [(0xA1, 0xB1), (0xA2, 0xB2)]):
        mine = {s.name: s for s in spans if s.attributes["brimful.task_id"] == task.task_id}
        assert set(mine) == {"brimful.wait_in_batch", "brimful.model_call", "brimful.store"}
        for one in mine.values():
            assert one.context.trace_id == trace and one.parent.span_id == span
            assert one.attributes["brimful.batch_id"] == batch.batch_id
        wait, call, store = mine["brimful.wait_in_batch"], mine["brimful.model_call"], mine["brimful.store"]
        assert (wait.start_time, wait.end_time) == (task.arrived_ns, batch.flushed_ns)
        assert wait.attributes["brimful.flush_reason"] == "slot_free"
        assert (call.start_time, call.end_time) == (2_100, 3_000)
        assert call.attributes["brimful.endpoint"] == "127.0.0.1:8001" and call.attributes["brimful.rows"] == 3
        assert (store.start_time, store.end_time) == (3_000, 3_500)


def test_a_batch_that_never_reached_the_model_records_only_its_wait() -> None:
    tracing, exporter = traced()
    task = TracedTask("t", [("traceparent", f"00-{0xA1:032x}-{0xB1:016x}-01".encode())], 1_000)
    batch = BatchTrace(
        batch_id="b",
        flush_reason="full",
        partition=0,
        flushed_ns=2_000,
        call_started_ns=0,
        call_ended_ns=0,
        stored_ns=3_000,
        endpoint="",
        rows=1,
        calls=0,
    )
    tracing.record_batch(batch, [task])
    assert [span.name for span in exporter.get_finished_spans()] == ["brimful.wait_in_batch"]

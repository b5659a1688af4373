"""OpenTelemetry tracing of a task's path, off by default (``BRIMFUL_TRACING_ENABLED``).

A task's trace starts at its POST (continuing the caller's W3C ``traceparent`` if it sent
one) and crosses Kafka in the record's headers, so the batcher's spans join it:

    brimful.accept              the POST, API side
      brimful.enqueue           recorded in Redis and acknowledged by the broker; its
                                context is what the Kafka record's headers carry
        brimful.wait_in_batch   fetched by the batcher until its batch left (flush reason, batch id)
        brimful.model_call      the batch's successful model call (endpoint, rows, calls)
        brimful.store           results stored and announced

The batcher records its three spans once the batch is stored, from timestamps taken on
the way, so the batch path itself does no tracing work. Spans leave through a background
OTLP/HTTP exporter (``BRIMFUL_TRACING_OTLP_ENDPOINT``). With tracing off, nothing of
OpenTelemetry is imported and every hook is one ``is None`` test.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from brimful.core.settings import Settings

# The W3C trace-context header names, as HTTP and Kafka headers carry them.
TRACE_HEADERS = ("traceparent", "tracestate")

KafkaHeaders = list[tuple[str, bytes]]


@dataclass(frozen=True)
class BatchTrace:
    """What one batch did, in wall-clock nanoseconds, for the spans of its tasks."""

    batch_id: str
    flush_reason: str
    partition: int
    flushed_ns: int
    call_started_ns: int
    call_ended_ns: int
    stored_ns: int
    endpoint: str
    rows: int
    calls: int


@dataclass(frozen=True)
class TracedTask:
    """A task of the batch that came with trace context: its headers and arrival."""

    task_id: str
    headers: Sequence[tuple[str, bytes]]
    arrived_ns: int


class Tracing:
    """The tracer of one process and the W3C propagator, with Brimful's spans."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("brimful")
        self._propagator = TraceContextTextMapPropagator()

    @contextmanager
    def server_span(self, name: str, headers: Mapping[str, str], **attributes: Any) -> Iterator[None]:
        """A span for a request, continuing the caller's trace context, current inside."""
        from opentelemetry import trace

        parent = self._propagator.extract({k: headers[k] for k in TRACE_HEADERS if k in headers})
        with self._tracer.start_as_current_span(
            name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
        ):
            yield

    @contextmanager
    def producer_span(self, name: str, **attributes: Any) -> Iterator[KafkaHeaders]:
        """A child of the current span around a send; yields the Kafka headers that carry it."""
        from opentelemetry import trace

        with self._tracer.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            yield [(key, value.encode()) for key, value in carrier.items()]

    def record_batch(self, batch: BatchTrace, tasks: Sequence[TracedTask]) -> None:
        """The batcher's spans of each traced task of a finished batch."""
        from opentelemetry import trace

        common: dict[str, Any] = {"brimful.batch_id": batch.batch_id, "brimful.partition": batch.partition}
        for task in tasks:
            carrier = {key: value.decode("latin-1") for key, value in task.headers if key in TRACE_HEADERS}
            parent = self._propagator.extract(carrier)
            if not trace.get_current_span(parent).get_span_context().is_valid:
                continue  # a header that is not a trace context
            attributes = {**common, "brimful.task_id": task.task_id}
            spans: tuple[tuple[str, int, int, dict[str, Any]], ...] = (
                (
                    "brimful.wait_in_batch",
                    task.arrived_ns,
                    batch.flushed_ns,
                    {"brimful.flush_reason": batch.flush_reason},
                ),
                (
                    "brimful.model_call",
                    batch.call_started_ns,
                    batch.call_ended_ns,
                    {"brimful.endpoint": batch.endpoint, "brimful.rows": batch.rows, "brimful.calls": batch.calls},
                ),
                ("brimful.store", batch.call_ended_ns, batch.stored_ns, {}),
            )
            for name, start, end, extra in spans:
                if not start or end < start:
                    continue  # a step this batch did not take (no successful call)
                span = self._tracer.start_span(
                    name,
                    context=parent,
                    kind=trace.SpanKind.CONSUMER if name == "brimful.wait_in_batch" else trace.SpanKind.INTERNAL,
                    start_time=start,
                    attributes={**attributes, **extra},
                )
                span.end(end_time=end)

    def shutdown(self) -> None:
        """Export what is buffered and stop."""
        self.provider.shutdown()


def configure_tracing(settings: Settings, service: str, exporter: SpanExporter | None = None) -> Tracing | None:
    """Tracing for this process as the settings ask (None when off). ``exporter`` replaces
    the OTLP exporter (tests use the SDK's in-memory one)."""
    if not settings.tracing_enabled:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as error:  # the optional extra is not installed
        raise RuntimeError("BRIMFUL_TRACING_ENABLED needs the tracing extra: pip install 'brimful[tracing]'") from error
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "service.namespace": "brimful"}),
        sampler=ParentBased(TraceIdRatioBased(settings.tracing_sample_ratio)),
    )
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Exported from a background thread in batches: the event loop never waits on it.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.tracing_otlp_endpoint)))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider)

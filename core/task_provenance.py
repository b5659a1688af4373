"""Where a finished task's time went, and the batch that computed it: its provenance.

The batcher that stores a batch's results writes each task's provenance in the same step
as its outputs (``Field.PROVENANCE``, in the one script call of the final move): no Redis
round trip more. What is stored is a small JSON object of wall-clock instants in
microseconds since the epoch and the facts of the model call that computed the task:

- ``batch_id``, ``partition``, ``flush_reason`` (``batcher/policy.py`` ``FlushReason``);
- ``rows`` (the real rows of that call), ``padded_rows`` (the empty rows padded to the
  model's batch size), ``model_calls`` (calls the batch made up to it: more than one after
  a transient failure or a split that isolated a failing row);
- ``endpoint``: the endpoint's id (``endpoint_id``), never its address;
- ``arrived_us`` (the batcher fetched the task), ``flushed_us`` (its batch left the
  accumulator), ``call_started_us`` and ``call_ended_us`` (the model call).

Each task's object differs only in ``arrived_us``: the rest is encoded once a call and
joined to each task's instant as bytes (``StoredProvenance``).

``provenance_answer`` turns it into what ``GET /v1/tasks/{id}`` shows: the facts, and the
time of each stage in milliseconds, named as the ``brimful_batch_stage_seconds`` metric
names them: ``to_batcher`` (submitted to fetched: the queue and the broker), ``in_batch``
(waiting in the accumulator for the batch to fill or leave), ``prepare`` (flushed to the
call's start: a free model slot, padding), ``call`` (at the model) and ``store`` (the call's
end to the result stored). The API's and the batcher's clocks are different hosts' clocks:
a stage that reads negative by their skew shows 0."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

# The stages in their order, as the answer and the stage metric name them.
STAGES = ("to_batcher", "in_batch", "prepare", "call", "store")


def endpoint_id(url: str) -> str:
    """A model endpoint's id: stable for its address, and not the address (an answer to a
    tenant names no internal host). ``/v1/stats`` shows each endpoint's id by its URL.
    No endpoint (a task answered without a call) has the empty id."""
    return "ep_" + hashlib.sha256(url.encode()).hexdigest()[:12] if url else ""


@dataclass(frozen=True)
class CallFacts:
    """What is common to every task a model call computed."""

    batch_id: str
    partition: int
    flush_reason: str
    rows: int
    padded_rows: int
    model_calls: int
    endpoint_url: str
    flushed_ns: int
    call_started_ns: int
    call_ended_ns: int


class StoredProvenance:
    """The stored provenance of a call's tasks: the common part encoded once, each task's
    object that part with its own arrival joined on (about a tenth of a microsecond)."""

    def __init__(self, facts: CallFacts) -> None:
        common = {
            "batch_id": facts.batch_id,
            "partition": facts.partition,
            "flush_reason": facts.flush_reason,
            "rows": facts.rows,
            "padded_rows": facts.padded_rows,
            "model_calls": facts.model_calls,
            "endpoint": endpoint_id(facts.endpoint_url),
            "flushed_us": facts.flushed_ns // 1000,
            "call_started_us": facts.call_started_ns // 1000,
            "call_ended_us": facts.call_ended_ns // 1000,
        }
        self._tail = b"," + orjson.dumps(common)[1:]  # the object's members after the first

    def of(self, arrived_ns: int) -> bytes:
        """One task's stored object, from when the batcher fetched it."""
        return b'{"arrived_us":%d' % (arrived_ns // 1000) + self._tail


def provenance_answer(stored: dict[str, Any], submitted_at_ms: int, updated_at_ms: int) -> dict[str, Any]:
    """The provenance as the API shows it, from the stored object and the record's own
    instants (submitted by the API, stored by the batcher: milliseconds). An instant not
    recorded (0) reads as the one before it: a stage of 0. On every answer of a done task:
    kept to plain reads and arithmetic."""
    submitted = submitted_at_ms * 1000
    arrived = stored.get("arrived_us") or submitted
    flushed = stored.get("flushed_us") or arrived
    started = stored.get("call_started_us") or flushed
    ended = stored.get("call_ended_us") or started
    finished = updated_at_ms * 1000 or ended
    return {
        "batch_id": stored.get("batch_id", ""),
        "partition": stored.get("partition", 0),
        "flush_reason": stored.get("flush_reason", ""),
        "rows": stored.get("rows", 0),
        "padded_rows": stored.get("padded_rows", 0),
        "model_calls": stored.get("model_calls", 0),
        "endpoint": stored.get("endpoint", ""),
        "stages_ms": {
            "to_batcher": _ms(arrived - submitted),
            "in_batch": _ms(flushed - arrived),
            "prepare": _ms(started - flushed),
            "call": _ms(ended - started),
            "store": _ms(finished - ended),
        },
    }


def _ms(span_us: int) -> float:
    """A stage in milliseconds; one two hosts' clocks make negative reads 0."""
    return span_us / 1000 if span_us > 0 else 0.0

"""Submitting a task: every check a POST body must pass, admission, and the enqueue.

The order matters and is the same for one task and for a bulk call: the body is
checked against the model's signature, then admission (model metadata, broker, backlog),
the tenant's payload limit and rate, and last the atomic record-and-admit in Redis
before the record goes to Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from redis.exceptions import RedisError

from brimful.api.auth import Principal
from brimful.api.errors import ApiError, unknown_model
from brimful.api.group_commit import GroupCommitterFull, GroupCommitterStopped, InFlightLimitReached
from brimful.api.state import ApiState
from brimful.core import metrics
from brimful.core.clock import now_ms
from brimful.core.model_catalogue import ModelCatalogue, UnknownModelError
from brimful.core.model_signature import ModelSignature
from brimful.core.task_record import NewTask
from brimful.core.task_status import TaskStatus
from brimful.core.tenant_limits import TenantLimits
from brimful.core.tensor_codec import InputValidationError, encode_input
from brimful.schemas import InputTensor, TaskRequest

log = logging.getLogger("brimful.api")

ALLOWED_FIELDS = ("inputs", "model", "deadline_ms", "cache", "priority")
PRIORITIES = ("normal", "low")
MAX_DEADLINE_MS = 3_600_000
# How long a retry waits for an earlier submission with its Idempotency-Key to finish.
IDEMPOTENCY_WAIT_S = 5.0
IDEMPOTENCY_POLL_S = 0.02
# How long a request that reaches an API process still starting (model signature or broker
# not there yet) waits for it before a 503: with several API workers behind one port, one
# can be ready while the next is still starting. Longer than the 2 s the start-up retries
# back off to, so a model or broker that answers now is found within it.
STARTUP_WAIT_S = 3.0
# What a record batch adds around one record (headers, key, lengths), kept free below
# the broker's message limit.
RECORD_OVERHEAD_BYTES = 256


@dataclass(frozen=True)
class Submission:
    """A validated task, ready to be written to the requests topic."""

    inputs: dict[str, InputTensor]
    model: str  # the model it is for: the one it named, or the catalogue's default
    deadline_ms: int | None = None  # the client wants the result within this many ms
    cache: bool = True  # False: its own model call, never a result computed for an identical task
    low_priority: bool = False  # bulk work: fills the slots normal tasks leave empty

    @property
    def payload_bytes(self) -> int:
        """Size of the encoded inputs: what the tenant's payload limit is measured on."""
        return sum(tensor.ByteSize() for tensor in self.inputs.values())


def parse_submission(document: Any, catalogue: ModelCatalogue) -> Submission:
    """Check a decoded body against the signature of the model it names (the default when
    it names none); 422 naming the first problem."""
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", 'body must be a JSON object like {"inputs": {...}}')
    unknown_fields = sorted(set(document) - set(ALLOWED_FIELDS))
    if unknown_fields:
        raise ApiError(
            422,
            "invalid_request",
            f"unknown field(s): {', '.join(unknown_fields)}; allowed: {', '.join(ALLOWED_FIELDS)}",
        )
    signature = model_named(document.get("model"), catalogue)
    inputs = document.get("inputs")
    if not isinstance(inputs, dict):
        raise ApiError(422, "invalid_request", 'body must have an "inputs" object mapping input names to values')
    expected = signature.input_names
    missing = [name for name in expected if name not in inputs]
    unknown = sorted(name for name in inputs if name not in expected)
    if unknown:
        raise ApiError(
            422,
            "unknown_input",
            f"unknown input(s): {', '.join(unknown)}; model {signature.name} takes: {', '.join(expected)}",
        )
    if missing:
        raise ApiError(422, "missing_input", f"missing input(s): {', '.join(missing)}")
    deadline_ms = document.get("deadline_ms")
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int) or not 1 <= deadline_ms <= MAX_DEADLINE_MS
    ):
        raise ApiError(
            422, "invalid_request", f"deadline_ms must be a whole number of milliseconds from 1 to {MAX_DEADLINE_MS}"
        )
    cache = document.get("cache", True)
    if not isinstance(cache, bool):
        raise ApiError(422, "invalid_request", "cache must be true or false (false: this task gets its own model call)")
    priority = document.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ApiError(422, "invalid_request", f"priority must be one of: {', '.join(PRIORITIES)}")
    encoded: dict[str, InputTensor] = {}
    for spec in signature.inputs:
        try:
            encoded[spec.name] = encode_input(spec, inputs[spec.name])
        except InputValidationError as error:
            raise ApiError(422, "invalid_input", str(error)) from error
    return Submission(
        inputs=encoded, model=signature.name, deadline_ms=deadline_ms, cache=cache, low_priority=priority == "low"
    )


def model_named(name: Any, catalogue: ModelCatalogue) -> ModelSignature:
    """The signature of the model a body's ``model`` field names (None: the default);
    422 when it is not a string or names no model served here."""
    if name is not None and not isinstance(name, str):
        raise ApiError(422, "invalid_request", "model must be a string naming a model (GET /v1/models lists them)")
    try:
        return catalogue.get(name)
    except UnknownModelError as error:
        raise unknown_model(error) from error


def check_payload(submission: Submission, limits: TenantLimits) -> None:
    """413 when the task's encoded inputs exceed the tenant's payload limit."""
    size = submission.payload_bytes
    if limits.max_payload_bytes and size > limits.max_payload_bytes:
        raise ApiError(
            413,
            "payload_too_large",
            f"the task's inputs take {size} bytes; this tenant's limit is {limits.max_payload_bytes} bytes per task",
        )


async def check_admission(state: ApiState) -> None:
    """503 while the models' metadata or the broker says no (after up to
    ``STARTUP_WAIT_S`` of waiting for them)."""
    if not state.serving:
        await state.wait_until_serving(STARTUP_WAIT_S)
    if state.catalogue is None:
        raise ApiError(503, "model_not_ready", "the model's metadata is not loaded yet", {"Retry-After": "1"})
    if not state.producer_started:
        raise ApiError(503, "broker_unavailable", "the broker is not reachable yet", {"Retry-After": "1"})


def check_backlog(state: ApiState, model: str) -> None:
    """503 while the model's own backlog is past ``max_backlog``: another model's backlog
    never refuses its tasks."""
    limit = state.settings.max_backlog
    topic = state.topics[model]
    backlog = state.backlog.backlog_of(topic)
    if backlog > limit:
        retry_after = state.backlog.retry_after_s(topic, limit)
        raise ApiError(
            503,
            "overloaded",
            f"{backlog} accepted tasks of model {model} are still unfinished (limit {limit}); "
            f"retry in about {retry_after} s",
            {"Retry-After": str(retry_after)},
        )


def _too_large_for_broker(size: int, limit: int) -> ApiError:
    # 413, not 503: the same task will never fit, so a client must not retry it.
    return ApiError(
        413,
        "payload_too_large",
        f"the task's record takes {size} bytes; the broker accepts at most {limit} bytes per task",
    )


async def claim_idempotency_key(state: ApiState, key: str, task_id: str, submission: Submission) -> str | None:
    """Claim ``key`` for this submission; None when claimed. When an earlier submission
    holds it: its task id once that one was accepted, waiting up to IDEMPOTENCY_WAIT_S
    while it is still under way (it may yet fail and free the key for this one); 409 with
    Retry-After if it is still under way then. Never the id of a task never accepted.

    A claim still pending past the longest a submission can take belongs to one that
    stopped without a word (its API killed, or stopped past its grace, between recording
    its task and binding the key): its task, if recorded, is the client's, so it is
    answered, after its request is sent again under its id should the broker never have
    had it (a batcher runs a task once whatever copies it reads); a task never recorded
    (or withdrawn) leaves the key to this submission."""
    settings = state.settings
    # Longer than any submission can take: the broker's timeout and Redis's pool wait, twice.
    stale_after_ms = 1000 * (2 * (settings.kafka_request_timeout_ms / 1000 + settings.redis_pool_timeout_s) + 5)
    deadline = time.monotonic() + IDEMPOTENCY_WAIT_S
    while True:
        held = await state.store.idempotency.claim(key, task_id)
        if held is None:
            return None
        if not held.pending:
            return held.task_id
        if now_ms() - held.claimed_at_ms > stale_after_ms:
            record = await state.store.get(held.task_id)
            if record is None:
                if await state.store.idempotency.take_over(key, held, task_id):
                    return None
                continue
            if await state.store.idempotency.take_over(key, held, held.task_id):
                if record.status is TaskStatus.QUEUED:
                    await resend(state, submission, held.task_id, record.tenant, record.submitted_at_ms)
                await commit_idempotency_key(state, key, held.task_id)
                log.warning(
                    "Idempotency-Key of a submission that stopped midway answered with its task",
                    extra={"task_id": held.task_id},
                )
                return held.task_id
            continue
        if time.monotonic() >= deadline:
            raise ApiError(
                409,
                "idempotency_key_in_use",
                "a request with this Idempotency-Key is still being accepted; retry shortly",
                {"Retry-After": "1"},
            )
        await asyncio.sleep(IDEMPOTENCY_POLL_S)


async def commit_idempotency_key(state: ApiState, key: str, task_id: str) -> None:
    """Bind the key to its task for the retention time, now that the task is accepted. The
    task is on the broker whatever happens here: a failure is logged, never answered."""
    try:
        if not await state.store.idempotency.commit(key, task_id):
            log.error("Idempotency-Key claim lapsed before its task was accepted", extra={"task_id": task_id})
    except RedisError as error:
        log.error("could not bind an Idempotency-Key to its task", extra={"task_id": task_id, "error": str(error)})


async def release_idempotency_key(state: ApiState, key: str, task_id: str) -> None:
    """Free the key of a submission that was not accepted; if Redis fails now, the claim
    lapses by itself (and retries meanwhile hear 409, never a task that does not exist)."""
    try:
        await state.store.idempotency.release(key, task_id)
    except RedisError as error:
        log.warning(
            "could not free an Idempotency-Key; it lapses by itself", extra={"task_id": task_id, "error": str(error)}
        )


async def take_tokens(state: ApiState, principal: Principal, count: int) -> None:
    """429 with Retry-After when the tenant is over its rate."""
    await state.rate_limiter.admit(principal.tenant, count)


def task_record(state: ApiState, submission: Submission, task_id: str, tenant: str, submitted_at: int) -> bytes:
    """The task's record on its model's requests topic (413 past the broker's limit)."""
    message = TaskRequest(
        task_id=task_id,
        model=submission.model,
        submitted_at_ms=submitted_at,
        deadline_at_ms=submitted_at + submission.deadline_ms if submission.deadline_ms else 0,
        tenant=tenant,
        no_cache=not submission.cache,
        low_priority=submission.low_priority,
    )
    for name, tensor in submission.inputs.items():
        message.inputs[name].CopyFrom(tensor)
    record = message.SerializeToString()
    limit = state.settings.kafka_max_message_bytes - RECORD_OVERHEAD_BYTES
    if len(record) > limit:
        raise _too_large_for_broker(len(record), limit)
    return record


async def resend(state: ApiState, submission: Submission, task_id: str, tenant: str, submitted_at: int) -> None:
    """Put a task already recorded back on the requests topic under its id (its first send
    may never have reached the broker); 503 if the broker does not take it."""
    record = task_record(state, submission, task_id, tenant, submitted_at)
    try:
        await state.producer.send_and_wait(state.topics[submission.model], record, key=task_id.encode())
    except KafkaError as error:
        raise ApiError(503, "broker_unavailable", "the broker did not accept the task", {"Retry-After": "1"}) from error


async def enqueue(
    state: ApiState, submission: Submission, task_id: str, tenant: str, max_in_flight: int, idempotency_key: str = ""
) -> None:
    """Record the task as queued (429 if the tenant has too many in flight), then put it
    on the requests topic (acks=all): in a group commit with the submissions that arrive
    alongside (``group_commit``). 503 while the model's backlog is past its limit.
    ``idempotency_key``: the key it was submitted with, which then lives as long as it."""
    check_backlog(state, submission.model)
    submitted_at = now_ms()
    record = task_record(state, submission, task_id, tenant, submitted_at)
    limit = state.settings.kafka_max_message_bytes - RECORD_OVERHEAD_BYTES
    try:
        # Redis first, with the submissions that arrive alongside: a fast batcher must
        # never find the task missing.
        new_task = NewTask(task_id, submitted_at, tenant, max_in_flight, submission.model, idempotency_key)
        if state.tracing is None:
            sent = await state.committers[submission.model].submit(new_task, record)
        else:
            with state.tracing.producer_span("brimful.enqueue", **{"brimful.task_id": task_id}) as headers:
                sent = await state.committers[submission.model].submit(new_task, record, headers)
    except InFlightLimitReached as refused:
        raise ApiError(
            429,
            "too_many_in_flight",
            f"this tenant has {refused.count} unfinished tasks, its limit; retry once some finish",
            {"Retry-After": "1"},
        ) from refused
    except GroupCommitterFull as error:
        raise ApiError(503, "overloaded", f"{error}; retry shortly", {"Retry-After": "1"}) from error
    except GroupCommitterStopped as error:  # still unwritten after the drain
        raise ApiError(503, "stopping", f"{error}; retry", {"Retry-After": "1"}) from error
    except RedisError as error:
        log.error("could not record task", extra={"task_id": task_id, "error": str(error)})
        raise ApiError(503, "store_unavailable", "the result store is unreachable", {"Retry-After": "1"}) from error
    except KafkaError as error:  # the task was taken back out of Redis
        log.error("could not enqueue task", extra={"task_id": task_id, "error": str(error)})
        if isinstance(error, MessageSizeTooLargeError):  # the broker's own limit is below the setting
            raise _too_large_for_broker(len(record), limit) from error
        raise ApiError(503, "broker_unavailable", "the broker did not accept the task", {"Retry-After": "1"}) from error
    state.backlog.produced(sent.topic, sent.partition, sent.offset)
    metrics.TASKS_SUBMITTED.labels(submission.model).inc()

"""A submission: what a task's body must be (every check a submitted task passes before
admission; ``api/tasks/submitter.py`` takes it from there), and the task's record on its
model's requests topic, written once at acceptance and again under the same id when a
submission that stopped midway is taken over (``resend``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError

from brimful.api.http.bodies import ApiError, unknown_model
from brimful.api.state import ApiState
from brimful.core.model_catalogue import (
    InputValidationError,
    ModelCatalogue,
    ModelSignature,
    UnknownModelError,
    encode_input,
)
from brimful.core.task_record import TaskStatus
from brimful.core.webhook_targets import TargetRefused, check_target, parse_target
from brimful.schemas import InputTensor, TaskRequest

log = logging.getLogger("brimful.api")

ALLOWED_FIELDS = ("inputs", "model", "deadline_ms", "cache", "priority", "callback_url")
PRIORITIES = ("normal", "low")
MAX_DEADLINE_MS = 3_600_000


@dataclass(frozen=True)
class Submission:
    """A validated task, ready to be written to the requests topic."""

    inputs: dict[str, InputTensor]
    model: str  # the model it is for: the one it named, or the catalogue's default
    deadline_ms: int | None = None  # the client wants the result within this many ms
    cache: bool = True  # False: its own model call, never a result computed for an identical task
    low_priority: bool = False  # bulk work: fills the slots normal tasks leave empty
    callback_url: str = ""  # where its final state is POSTed (checked by Submitter.submit: check_callback)

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
    low = low_priority(document.get("priority", "normal"))
    callback_url = document.get("callback_url", "")
    if not isinstance(callback_url, str):
        raise ApiError(422, "invalid_request", "callback_url must be a string: an http(s) URL")
    if callback_url:
        try:
            parse_target(callback_url, frozenset())
        except TargetRefused as error:
            raise ApiError(400, "invalid_callback_url", f"callback_url: {error}") from error
    encoded: dict[str, InputTensor] = {}
    for spec in signature.inputs:
        try:
            encoded[spec.name] = encode_input(spec, inputs[spec.name])
        except InputValidationError as error:
            raise ApiError(422, "invalid_input", str(error)) from error
    return Submission(
        inputs=encoded,
        model=signature.name,
        deadline_ms=deadline_ms,
        cache=cache,
        low_priority=low,
        callback_url=callback_url,
    )


def low_priority(priority: Any) -> bool:
    """Whether a task's ``priority`` (a body's field, or the Arrow route's query) asks for
    bulk work; 422 when it is not one of ``PRIORITIES``."""
    if priority not in PRIORITIES:
        raise ApiError(422, "invalid_request", f"priority must be one of: {', '.join(PRIORITIES)}")
    return bool(priority == "low")


def queued_answer(task_id: str, model: str) -> dict[str, str]:
    """What a task just accepted is answered: its id, its model, ``queued``."""
    return {"task_id": task_id, "model": model, "status": TaskStatus.QUEUED.value}


async def check_callback(submission: Submission, allowed_hosts: frozenset[str]) -> None:
    """400 when the task's callback_url points inside this network (its host resolves to a
    loopback, private or link-local address) and is not allowed by name."""
    if submission.callback_url:
        try:
            await check_target(submission.callback_url, allowed_hosts)
        except TargetRefused as error:
            raise ApiError(400, "invalid_callback_url", f"callback_url: {error}") from error


def model_named(name: Any, catalogue: ModelCatalogue) -> ModelSignature:
    """The signature of the model a body's ``model`` field names (None: the default);
    422 when it is not a string or names no model served here."""
    if name is not None and not isinstance(name, str):
        raise ApiError(422, "invalid_request", "model must be a string naming a model (GET /v1/models lists them)")
    try:
        return catalogue.get(name)
    except UnknownModelError as error:
        raise unknown_model(error) from error


# the broker's message limit.
RECORD_OVERHEAD_BYTES = 256


def broker_refused() -> ApiError:
    """503: the broker did not take the task's record (retry: the task is not accepted)."""
    return ApiError(503, "broker_unavailable", "the broker did not accept the task", retry_after_s=1)


def too_large_for_broker(size: int, limit: int) -> ApiError:
    # 413, not 503: the same task will never fit, so a client must not retry it.
    return ApiError(
        413,
        "payload_too_large",
        f"the task's record takes {size} bytes; the broker accepts at most {limit} bytes per task",
    )


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
        callback_url=submission.callback_url,
    )
    for name, tensor in submission.inputs.items():
        message.inputs[name].CopyFrom(tensor)
    record: bytes = message.SerializeToString()
    limit = state.record_limit - RECORD_OVERHEAD_BYTES
    if len(record) > limit:
        raise too_large_for_broker(len(record), limit)
    return record


async def resend(state: ApiState, submission: Submission, task_id: str, tenant: str, submitted_at: int) -> None:
    """Put a task already recorded back on the requests topic under its id (its first send
    may never have reached the broker); 503 if the broker does not take it."""
    record = task_record(state, submission, task_id, tenant, submitted_at)
    try:
        await state.producer.send_and_wait(state.topic_now(submission.model), record, key=task_id.encode())
    except KafkaError as error:
        raise broker_refused() from error

"""A task's record on its model's requests topic: written once at acceptance, and again
under the same id when a submission that stopped midway is taken over."""

from __future__ import annotations

from aiokafka.errors import KafkaError

from brimful.api.http.errors import ApiError
from brimful.api.state import ApiState
from brimful.api.tasks.submission import Submission
from brimful.schemas import TaskRequest

# What a record batch adds around one record (headers, key, lengths), kept free below
# the broker's message limit.
RECORD_OVERHEAD_BYTES = 256


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
    record = message.SerializeToString()
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
        raise ApiError(503, "broker_unavailable", "the broker did not accept the task", retry_after_s=1) from error

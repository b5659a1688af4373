"""Idempotency-Key on ``POST /v1/tasks``: a client's retry gets the task its first try made.

The key is claimed before the task is admitted, bound to the task once it is accepted,
and freed if it is not (``core/idempotency_keys.py`` keeps them in Redis)."""

from __future__ import annotations

import asyncio
import logging
import re
import time

from redis.exceptions import RedisError

from brimful.api.http.bodies import ApiError
from brimful.api.state import ApiState
from brimful.api.tasks.group_commit import longest_submission_s
from brimful.api.tasks.submission import Submission, resend
from brimful.core.clock import now_ms
from brimful.core.task_record import TaskStatus

log = logging.getLogger("brimful.api")

IDEMPOTENCY_KEY_MAX_LENGTH = 255
IDEMPOTENCY_KEY_PATTERN = re.compile(rf"^[\x21-\x7e]{{1,{IDEMPOTENCY_KEY_MAX_LENGTH}}}$")
# How long a retry waits for an earlier submission with its Idempotency-Key to finish.
IDEMPOTENCY_WAIT_S = 5.0
IDEMPOTENCY_POLL_S = 0.02


def checked_idempotency_key(header: str) -> str:
    """The Idempotency-Key header's value; 400 if it is not 1-255 visible ASCII characters
    (a key no client can send is left for Brimful's own)."""
    if not IDEMPOTENCY_KEY_PATTERN.match(header):
        raise ApiError(
            400,
            "invalid_idempotency_key",
            f"Idempotency-Key must be 1-{IDEMPOTENCY_KEY_MAX_LENGTH} visible ASCII characters",
            param="Idempotency-Key",
        )
    return header


def key_in_use() -> ApiError:
    """The answer to a retry whose first try is still under way."""
    return ApiError(
        409,
        "idempotency_key_in_use",
        "a request with this Idempotency-Key is still being accepted; retry shortly",
        retry_after_s=1,
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
    stale_after_ms = 1000 * longest_submission_s(state.settings)
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
            raise key_in_use()
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

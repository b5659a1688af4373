"""The life of a task, as clients see it through ``GET /v1/tasks/{id}``."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Where a task stands. ``done``, ``failed`` and ``cancelled`` are final."""

    QUEUED = "queued"  # accepted and on the requests topic
    RUNNING = "running"  # in a batch at the model
    DONE = "done"  # outputs stored
    FAILED = "failed"  # retries exhausted; the request is on the DLQ
    CANCELLED = "cancelled"  # cancelled before it reached the model
    EXPIRED = "expired"  # its deadline passed before it was sent to the model: never computed

    @property
    def is_final(self) -> bool:
        return self in (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED)

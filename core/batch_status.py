"""Where an OpenAI-style batch job stands, and the moves between states it may make.

``validating`` (the input file is read once and every line checked), ``in_progress`` (its
lines run as low-priority tasks), ``finalizing`` (the output and error files are written),
then ``completed``. A cancel moves a job that has not ended to ``cancelling``: what was not
dispatched is cancelled, and it ends ``cancelled``; a job past its completion window ends
``expired`` the same way; a job whose input cannot be read ends ``failed`` (the same way
too, once it has started). Jobs that end early keep the lines that finished in their
output file.
"""

from __future__ import annotations

from enum import StrEnum

from brimful.core.number_text import duration_s


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in _FINAL

    @property
    def is_running(self) -> bool:
        """Its lines may still be read or submitted."""
        return self in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)

    @property
    def timestamp_field(self) -> str:
        """The Batch object's field that records when it reached this state."""
        return _TIMESTAMPS[self]


_FINAL = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
_TIMESTAMPS = {
    BatchStatus.VALIDATING: "created_at",
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}
TIMESTAMP_FIELDS = tuple(_TIMESTAMPS.values())

# The moves a job may make (any other is refused by the store).
MOVES: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING, BatchStatus.FINALIZING}
    ),
    BatchStatus.IN_PROGRESS: frozenset({BatchStatus.FINALIZING, BatchStatus.CANCELLING, BatchStatus.FAILED}),
    BatchStatus.CANCELLING: frozenset({BatchStatus.FINALIZING, BatchStatus.FAILED}),
    BatchStatus.FINALIZING: frozenset(
        {BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED, BatchStatus.FAILED}
    ),
}


def may_move(current: BatchStatus, new: BatchStatus) -> bool:
    return new in MOVES.get(current, frozenset())


def parse_window(text: str, longest_s: int) -> int | None:
    """A completion window in seconds: OpenAI's ``24h``, or any from ``1s`` to ``longest_s``
    written with a unit (``90s``, ``30m``, ``2h``); None when it is not one."""
    return duration_s(text, longest_s)

"""What kind of failure a model call raised: the input to every retry decision."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorClass(StrEnum):
    """Failure classes, from the client's point of view."""

    UNAVAILABLE = "unavailable"  # server down, connection refused or reset, model still loading
    TIMEOUT = "timeout"  # the call outlived infer_timeout_s
    MODEL_ERROR = "model_error"  # the model ran and raised on this batch
    REJECTED = "rejected"  # the server refused the request as malformed
    INTERNAL = "internal"  # anything else

    @property
    def is_transient(self) -> bool:
        """Whether the same batch may well succeed later, unchanged."""
        return self in (ErrorClass.UNAVAILABLE, ErrorClass.TIMEOUT)


@dataclass
class ModelCallError(Exception):
    """A failed model call, classified."""

    error_class: ErrorClass
    message: str

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"


def summarize(message: str) -> str:
    """The line of a server error worth showing first (model errors carry whole tracebacks)."""
    lines = [line.strip() for line in message.replace("\\n", "\n").splitlines()]
    meaningful = [line for line in lines if line and not line.startswith(("At:", "File ", "^", "Traceback", "raise "))]
    for line in reversed(meaningful):
        if ": " in line and not line.startswith("/"):
            return line[:500]
    return (meaningful[-1] if meaningful else message)[:500]


class TransientOutageTooLong(Exception):
    """Transient failures outlasted ``transient_give_up_s``: the batch's tasks fail."""

    def __init__(self, error: ModelCallError) -> None:
        super().__init__(str(error))
        self.error = error

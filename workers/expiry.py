"""Which rows of a batch are past their deadline: the pure decision behind ``expired``.

A task may carry a deadline (``deadline_ms`` at submission, ``deadline_at_ms`` on its
record). One whose deadline has passed when its batch is about to run is never computed:
the client said its result would be of no use by then, and the slot goes to rows still in
time. It is decided at the last moment before the call, on the batcher's wall clock against the
deadline the API set on its own (hosts keep their clocks in sync), so a row is never
dropped that could still have been answered in time.
"""

from __future__ import annotations

from collections.abc import Sequence

from brimful.workers.batch import BatchItem


def past_deadline(items: Sequence[BatchItem], now_ms: int) -> list[BatchItem]:
    """The items whose deadline is before ``now_ms`` (wall clock); those with none never are."""
    return [item for item in items if 0 < item.request.deadline_at_ms < now_ms]


def expiry_reason(item: BatchItem, now_ms: int) -> dict[str, object]:
    """What an expired task's record says: how late its batch was."""
    late_ms = now_ms - item.request.deadline_at_ms
    return {
        "class": "expired",
        "message": f"its deadline passed {late_ms} ms before it could be sent to the model; it was not computed",
        "deadline_at_ms": item.request.deadline_at_ms,
    }

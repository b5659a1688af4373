"""Low-priority rows: bulk work that fills the slots a batch would otherwise pad.

Pure, on the caller's clock, like the accumulator. A partition's low-priority rows wait
here, apart from its normal rows, and leave three ways:

- **top-up**: a normal batch that leaves with empty slots takes the oldest low rows into
  them, so a slot that would carry padding carries work;
- **backfill**: while the partition has no normal row waiting and expects none within the
  latency target (its normal arrival rate times the target is under one row), a free
  model slot takes a batch of low rows alone;
- **promotion**: a low row that waited ``low_max_wait`` joins the normal rows, in order,
  and competes as one of them. That is the bound on how long low-priority work can starve:
  under a normal load that fills every batch, it waits ``low_max_wait`` and then queues
  as normal work does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from brimful.batcher.accumulator import Pending, split_matching

T = TypeVar("T")


class LowPriorityQueue(Generic[T]):
    """One partition's low-priority rows, oldest first."""

    def __init__(self) -> None:
        self._rows: deque[Pending[T]] = deque()

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, item: T, now: float, stamp: float | None = None) -> None:
        self._rows.append(Pending(item, now, None, stamp))

    def take(self, count: int) -> list[Pending[T]]:
        """The oldest ``count`` rows at most (a top-up, or a backfill batch)."""
        return [self._rows.popleft() for _ in range(min(count, len(self._rows)))]

    def overdue(self, now: float, low_max_wait: float) -> list[Pending[T]]:
        """Remove and return the rows that waited ``low_max_wait`` or longer: promoted."""
        promoted = []
        while self._rows and now - self._rows[0].arrived_at >= low_max_wait:
            promoted.append(self._rows.popleft())
        return promoted

    def next_promotion(self, low_max_wait: float) -> float | None:
        """When the oldest row is promoted; None when nothing waits."""
        return self._rows[0].arrived_at + low_max_wait if self._rows else None

    def remove(self, matches: Callable[[T], bool]) -> list[Pending[T]]:
        """Take out the rows whose item ``matches`` (a cancelled task), keeping order."""
        self._rows, removed = split_matching(self._rows, matches)
        return removed

    def drain(self) -> list[Pending[T]]:
        rows = list(self._rows)
        self._rows.clear()
        return rows


def backfill_due(normal_pending: int, normal_rate: float, latency_target: float, low_pending: int) -> bool:
    """Whether a free slot should take a batch of low-priority rows alone: some wait, no
    normal row waits, and none is expected within the latency target (a normal row that
    came now would find the slot taken for up to one call)."""
    return low_pending > 0 and normal_pending == 0 and normal_rate * latency_target < 1.0

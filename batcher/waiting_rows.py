"""The rows waiting in a batcher, indexed by task id, and the cancels heard for them.

A cancel of a task this batcher does not hold costs a lookup, not a scan; the rows
cancelled meanwhile leave together at the loop's next turn, one pass over each queue that
holds any, so a flood of cancels costs a pass per turn, not a scan per cancel."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from brimful.batcher.partition_state import PartitionState

log = logging.getLogger("brimful.batcher")


class WaitingRows:
    """Task id -> the partition whose queues hold it, and the cancels not yet applied."""

    def __init__(self) -> None:
        self._partition_of: dict[str, int] = {}
        self._cancelled: set[str] = set()

    def add(self, task_id: str, partition: int) -> None:
        self._partition_of[task_id] = partition

    def left(self, task_id: str) -> None:
        """The row left its queue: dispatched, or dropped with its partition."""
        self._partition_of.pop(task_id, None)

    def cancel(self, task_id: str) -> bool:
        """Note a cancel for the next turn; False when the task does not wait here."""
        if task_id not in self._partition_of:
            return False
        self._cancelled.add(task_id)
        return True

    @property
    def cancels_waiting(self) -> bool:
        return bool(self._cancelled)

    def drop_cancelled(self, partitions: Mapping[int, PartitionState]) -> int:
        """Take the cancelled rows out of their partitions' queues, one pass a queue, and
        finish their offsets; returns how many left."""
        left = 0
        for number, task_ids in self._take_cancelled().items():
            state = partitions.get(number)
            if state is None:
                continue
            removed = state.accumulator.remove(lambda item: item.task_id in task_ids)  # noqa: B023 (called here)
            removed += state.low.remove(lambda item: item.task_id in task_ids)  # noqa: B023 (called here)
            if state.tracker is not None:
                for row in removed:
                    state.tracker.finish(row.item.offset)
            for row in removed:
                log.debug("cancelled task left its batch", extra={"task_id": row.item.task_id, "partition": number})
            log.info("cancelled tasks left their batches", extra={"partition": number, "tasks": len(removed)})
            left += len(removed)
        return left

    def _take_cancelled(self) -> dict[int, set[str]]:
        """The cancelled rows still waiting, by partition; forgotten here."""
        by_partition: dict[int, set[str]] = {}
        for task_id in self._cancelled:
            number = self._partition_of.pop(task_id, None)
            if number is not None:
                by_partition.setdefault(number, set()).add(task_id)
        self._cancelled.clear()
        return by_partition

"""What a batcher holds for one assigned partition, and how far behind it is; and the rows
waiting in the batcher across its partitions (``WaitingRows``), indexed by task id, with
the cancels heard for them.

A cancel of a task this batcher does not hold costs a lookup, not a scan; the rows
cancelled meanwhile leave together at the loop's next turn, one pass over each queue that
holds any, so a flood of cancels costs a pass per turn, not a scan per cancel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from brimful.batcher.accumulator import Accumulator, LowPriorityQueue
from brimful.batcher.offsets import GapPatience, OffsetTracker
from brimful.workers.batch import BatchItem


@dataclass
class PartitionState:
    """Everything the batcher holds for one assigned partition."""

    tp: TopicPartition
    accumulator: Accumulator[BatchItem]
    gaps: GapPatience  # how long a gap in its offsets is read again
    tracker: OffsetTracker | None = None  # created at the first record: its offset is the start
    committed: int = -1
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    paused: bool = False
    fetched_to: int = -1  # offset after the last record fetched; -1: none yet
    fetched_stamp: float | None = None  # produce time (wall-clock s) of the last record fetched
    # Low-priority rows: they top up this partition's batches and fill idle slots.
    low: LowPriorityQueue[BatchItem] = field(default_factory=LowPriorityQueue)

    def _finished_to(self) -> int | None:
        """The offset before which every record is finished here; None before the first fetch."""
        if self.tracker is not None:
            return self.tracker.safe_to_commit
        return self.committed if self.committed >= 0 else None

    def lag_rows(self, highwater: int) -> int:
        """Records not yet finished (0 until this batcher has fetched from the partition)."""
        finished = self._finished_to()
        return 0 if finished is None else max(0, highwater - finished)

    def lag_seconds(self, highwater: int, now: float, wall_now: float) -> float:
        """How far behind the head in time: the oldest waiting row's age, or while records
        wait unfetched in the broker, the age of the last one fetched (the next is younger,
        so this bounds it from above); 0 when caught up."""
        oldest = self.accumulator.oldest_arrival
        waiting = now - oldest if oldest is not None else 0.0
        unfetched = 0.0
        finished = self._finished_to()
        if finished is not None and highwater > max(self.fetched_to, finished) and self.fetched_stamp is not None:
            unfetched = wall_now - self.fetched_stamp
        return max(0.0, waiting, unfetched)


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

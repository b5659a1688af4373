"""What a batcher holds for one assigned partition, and how far behind it is."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from brimful.batcher.accumulator import Accumulator
from brimful.batcher.backfill import LowPriorityQueue
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

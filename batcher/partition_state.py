"""What a batcher holds for one assigned partition, and how far behind it is: its offsets,
which of them are safe to commit, and their commits; and the rows waiting in the batcher
across its partitions (``WaitingRows``), indexed by task id, with the cancels heard for
them.

Which offsets are safe to commit (``OffsetTracker``, pure bookkeeping): batches of one
partition complete out of order (several are in flight). Committing offset N tells Kafka
that everything below N is finished, so the committable offset is the first one received
but not yet finished. Offsets need not be contiguous (compaction and transaction markers
leave gaps), so the tracker keeps the offsets it actually received rather than assuming
N+1 follows N. But a gap may also be a record not yet readable: a broker can hand out an
offset before the record under it can be fetched (the embedded broker does, with two
producers writing one partition at once), and a fetch then skips it. Taken as a real gap,
that task would never be read, and the commit would pass it. So a gap is read again
(``GapPatience``) for a while before it is taken as real.

``OffsetCommitter`` commits each partition's finished offsets, so a crash can only cause
redelivery, never a skipped task. The commits of batches that finish close together go as
one (``commit_every_s``); an offset is committed no sooner than ``commit_after_stored_s``
after its results were stored (a Redis that syncs its log every second can lose that much
to a kill, and the records of what it lost must be read again); each commit is bounded in
time, since a broker that lost the topic can make it retry for ever.

A cancel of a task this batcher does not hold costs a lookup, not a scan; the rows
cancelled meanwhile leave together at the loop's next turn, one pass over each queue that
holds any, so a flood of cancels costs a pass per turn, not a scan per cancel."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from brimful.batcher.accumulator import Accumulator, LowPriorityQueue
from brimful.workers.batch import BatchItem

log = logging.getLogger("brimful.batcher")


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


# --- from batcher/partition_state.py ---
# Commits each partition's finished offsets (``OffsetTracker.safe_to_commit``), so a


class Committing(Protocol):
    """What the committer needs of the Kafka consumer."""

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None: ...


class OffsetCommitter:
    """Commits finished offsets when told there are some (``want``)."""

    def __init__(
        self,
        consumer: Committing,
        partitions: Callable[[], Mapping[int, PartitionState]],
        timeout_s: float,
        every_s: float,
        after_stored_s: float,
    ) -> None:
        """``partitions``: the partitions assigned now (a revoked one is never committed
        by a round that began before it was revoked)."""
        self._consumer = consumer
        self._partitions = partitions
        self._timeout_s = timeout_s
        self._every_s = every_s
        self._after_stored_s = after_stored_s
        self._wanted = asyncio.Event()

    def want(self) -> None:
        """Some offsets finished: commit them in the next round."""
        self._wanted.set()

    async def run(self) -> None:
        """Commit rounds until cancelled."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            states = list(self._partitions().values())
            finished = {state.tp: state.tracker.safe_to_commit for state in states if state.tracker is not None}
            if self._after_stored_s > 0:
                # What finished by now is durable in Redis once this passes; what finishes
                # meanwhile waits for the next round.
                await asyncio.sleep(self._after_stored_s)
            assigned = [state for state in states if self._partitions().get(state.tp.partition) is state]
            await self.commit(assigned, finished)
            await asyncio.sleep(self._every_s)  # the commits of batches finishing meanwhile go as one

    async def commit(self, states: list[PartitionState], upto: dict[TopicPartition, int] | None = None) -> None:
        """Commit each partition's finished offsets (``upto``: no further than these)."""
        offsets = {
            state.tp: OffsetAndMetadata(safe, "")
            for state in states
            if state.tracker is not None
            and (safe := min(state.tracker.safe_to_commit, (upto or {}).get(state.tp, state.tracker.safe_to_commit)))
            > state.committed
        }
        if not offsets:
            return
        try:
            async with asyncio.timeout(self._timeout_s):  # no task a commit, as wait_for makes
                await self._consumer.commit(offsets)
        except Exception as error:
            log.warning("offset commit failed; will retry", extra={"error": repr(error)})
            self._wanted.set()
            return
        for state in states:
            if state.tp in offsets:
                state.committed = offsets[state.tp].offset


# --- from batcher/partition_state.py ---
# Which offsets of a partition are safe to commit: pure bookkeeping.
class OffsetTracker:
    """Received and finished offsets of one partition, and the safe commit point."""

    def __init__(self, start: int) -> None:
        # ``start`` is where consumption began: the committed offset, or the log start.
        self._received: deque[int] = deque()
        self._finished: set[int] = set()
        self._next_expected = start
        self._safe = start

    def gap_before(self, offset: int) -> int | None:
        """The first offset skipped if ``offset`` came next, or None when nothing is."""
        return self._next_expected if offset > self._next_expected else None

    def receive(self, offset: int) -> bool:
        """Record an offset handed out for processing. False for one already seen (a
        replayed fetch), which the caller must then skip."""
        if offset < self._next_expected:
            return False
        self._received.append(offset)
        self._next_expected = offset + 1
        return True

    def finish(self, offset: int) -> None:
        """Record that an offset's work is stored (result, failure or dead letter)."""
        if offset < self._safe or offset >= self._next_expected:
            return
        self._finished.add(offset)
        while self._received and self._received[0] in self._finished:
            self._finished.discard(self._received.popleft())
        self._safe = self._received[0] if self._received else self._next_expected

    @property
    def safe_to_commit(self) -> int:
        """The offset to commit: every offset below it is finished."""
        return self._safe


class GapPatience:
    """How long one gap in a partition's offsets is read again before it is taken as real.

    Pure: the caller passes the time in. While ``keep_reading`` says so, the caller reads
    the partition again from the gap rather than past it."""

    def __init__(self, patience_s: float) -> None:
        self._patience_s = patience_s
        self._gap: int | None = None  # the first offset of the gap being read again
        self._since = 0.0

    def keep_reading(self, gap: int, now: float) -> bool:
        """Whether to read again from ``gap`` (its first skipped offset), seen at ``now``."""
        if gap != self._gap:
            self._gap, self._since = gap, now
        return now - self._since < self._patience_s


def first_gap(offsets: Sequence[int], gap_before: int | None) -> tuple[int, int | None]:
    """Where a fetch's records (their ``offsets``, rising) stop following on from what was
    read before them (``gap_before``: ``OffsetTracker.gap_before`` of the first) or from
    each other: how many of them to take, and the first offset missing (None: take all).
    From a gap that may still fill the partition is read again: a record skipped would
    never be read, and the commit would pass it."""
    if not offsets:
        return 0, None
    if gap_before is not None:
        return 0, gap_before
    if offsets[-1] - offsets[0] + 1 == len(offsets):  # contiguous: the common case
        return len(offsets), None
    index = next((i for i in range(1, len(offsets)) if offsets[i] > offsets[i - 1] + 1), None)
    if index is None:  # no hole, only repeats (which the tracker skips)
        return len(offsets), None
    return index, offsets[index - 1] + 1

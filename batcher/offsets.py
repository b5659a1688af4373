"""Which offsets of a partition are safe to commit: pure bookkeeping.

Batches of one partition complete out of order (several are in flight). Committing
offset N tells Kafka that everything below N is finished, so the committable offset
is the first one received but not yet finished. Offsets need not be contiguous
(compaction and transaction markers leave gaps), so the tracker keeps the offsets it
actually received rather than assuming N+1 follows N.

But a gap may also be a record not yet readable: a broker can hand out an offset before
the record under it can be fetched (the embedded broker does, with two producers writing
one partition at once), and a fetch then skips it. Taken as a real gap, that task would
never be read, and the commit would pass it. So a gap is read again (``GapPatience``) for
a while before it is taken as real.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


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

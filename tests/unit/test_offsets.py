"""Offset bookkeeping: only offsets below which everything is finished are committed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brimful.batcher.partition_state import GapPatience, OffsetTracker, first_gap


def test_nothing_finished_commits_the_start() -> None:
    tracker = OffsetTracker(start=10)
    for offset in range(10, 15):
        assert tracker.receive(offset)
    assert tracker.safe_to_commit == 10


def test_out_of_order_completion_waits_for_the_gap() -> None:
    tracker = OffsetTracker(start=0)
    for offset in range(6):
        tracker.receive(offset)
    tracker.finish(3)
    tracker.finish(4)
    assert tracker.safe_to_commit == 0
    tracker.finish(0)
    assert tracker.safe_to_commit == 1
    for offset in (1, 2):
        tracker.finish(offset)
    assert tracker.safe_to_commit == 5
    tracker.finish(5)
    assert tracker.safe_to_commit == 6


def test_gaps_in_the_log_are_skipped_once_their_neighbours_finish() -> None:
    tracker = OffsetTracker(start=0)
    for offset in (0, 1, 5, 9):  # 2-4 and 6-8 were compacted away or are markers
        tracker.receive(offset)
    for offset in (9, 5, 1, 0):
        tracker.finish(offset)
    assert tracker.safe_to_commit == 10


def test_a_replayed_offset_is_refused() -> None:
    tracker = OffsetTracker(start=0)
    assert tracker.receive(0)
    assert tracker.receive(1)
    assert not tracker.receive(1)
    assert not tracker.receive(0)


def test_finishing_twice_or_unknown_offsets_changes_nothing() -> None:
    tracker = OffsetTracker(start=0)
    tracker.receive(0)
    tracker.receive(1)
    tracker.finish(7)
    tracker.finish(1)
    tracker.finish(1)
    assert tracker.safe_to_commit == 0
    tracker.finish(0)
    assert tracker.safe_to_commit == 2


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=10_000),
    steps=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=120),
    data=st.data(),
)
def test_commit_point_is_always_the_first_unfinished_offset(start: int, steps: list[int], data: st.DataObject) -> None:
    offsets = []
    offset = start
    for step in steps:
        offsets.append(offset)
        offset += step  # gaps of up to 2 between received offsets
    tracker = OffsetTracker(start=start)
    for received in offsets:
        tracker.receive(received)
    finished: set[int] = set()
    order = data.draw(st.permutations(offsets))
    for done in order:
        tracker.finish(done)
        finished.add(done)
        unfinished = [o for o in offsets if o not in finished]
        expected = unfinished[0] if unfinished else offsets[-1] + 1
        assert tracker.safe_to_commit == expected
        # Never past an unfinished offset: everything below the commit point is finished.
        assert all(o in finished for o in offsets if o < tracker.safe_to_commit)


def test_a_skipped_offset_is_named_until_it_is_received() -> None:
    tracker = OffsetTracker(5)
    assert tracker.gap_before(5) is None
    assert tracker.receive(5)
    assert tracker.gap_before(6) is None
    assert tracker.gap_before(8) == 6  # 6 and 7 would be skipped
    assert tracker.receive(6) and tracker.gap_before(8) == 7


def test_a_gap_is_read_again_for_its_patience_then_taken_as_real() -> None:
    patience = GapPatience(1.0)
    assert patience.keep_reading(6, now=10.0)
    assert patience.keep_reading(6, now=10.9)  # the same gap, still within its patience
    assert not patience.keep_reading(6, now=11.0)  # real: read past it
    assert patience.keep_reading(9, now=11.0)  # another gap starts its own patience
    assert patience.keep_reading(6, now=11.5)  # and one seen again later, too


def test_a_fetch_is_taken_up_to_its_first_hole() -> None:
    assert first_gap([5, 6, 7], None) == (3, None)  # contiguous: all of it
    assert first_gap([5, 6, 9, 10], None) == (2, 7)  # 7 and 8 may still fill: read again from 7
    assert first_gap([8, 9], 5) == (0, 5)  # a hole before the fetch: none of it yet
    assert first_gap([5, 5, 6], None) == (3, None)  # a repeat is no hole (the tracker skips it)
    assert first_gap([], None) == (0, None)

"""The API's bookkeeping of confirmations and sweeps (``api/tasks/group_commit.py``): what
it keeps when Redis fails, and how far one sweep goes. Redis's side is tested on a real
one (tests/integration/test_task_store.py, tests/faults/test_unconfirmed_submissions.py)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from brimful.api.tasks.group_commit import SWEEP_MAX_CALLS, SubmissionReceipts
from brimful.core.admission import COMMAND_MEMBERS, UnconfirmedTasks


class RecordingSet(UnconfirmedTasks):
    """The unconfirmed set's calls, answered from memory; ``fail_next`` confirms fail."""

    def __init__(self, stale: int = 0) -> None:
        self.confirmed: list[list[str]] = []
        self.fail_next = 0
        self.stale = stale  # entries a sweep finds
        self.release_calls = 0
        self.cutoffs: list[int] = []

    async def confirm(self, members: list[str]) -> None:  # type: ignore[override]
        if self.fail_next:
            self.fail_next -= 1
            raise RedisConnectionError("down")
        self.confirmed.append(list(members))

    async def release_stale(self, recorded_before_ms: int) -> list[tuple[str, str]]:
        self.release_calls += 1
        self.cutoffs.append(recorded_before_ms)
        taken = min(self.stale, COMMAND_MEMBERS)
        self.stale -= taken
        return [(f"{i:032x}", "t") for i in range(taken)]


async def test_confirmations_a_failed_write_kept_go_with_the_next_flush_in_order() -> None:
    unconfirmed = RecordingSet()
    receipts = SubmissionReceipts(unconfirmed, longest_submission_s=10.0)
    receipts.confirmed([("a", "t1"), ("b", "t2")])
    unconfirmed.fail_next = 1
    await receipts.flush()
    assert unconfirmed.confirmed == [] and receipts.pending == 2
    receipts.confirmed([("c", "t1")])
    await receipts.flush()
    assert unconfirmed.confirmed == [["a t1", "b t2", "c t1"]] and receipts.pending == 0
    await receipts.flush()  # nothing noted: no write
    assert len(unconfirmed.confirmed) == 1


async def test_a_sweep_takes_every_stale_entry_up_to_its_bound() -> None:
    few = RecordingSet(stale=COMMAND_MEMBERS + 5)
    receipts = SubmissionReceipts(few, 10.0, wall_s=lambda: 100.0)
    assert len(await receipts.sweep()) == COMMAND_MEMBERS + 5
    assert few.release_calls == 2
    assert few.cutoffs == [int(1000 * (100.0 - receipts.stale_after_s))] * 2  # recorded before this: stale
    many = RecordingSet(stale=COMMAND_MEMBERS * (SWEEP_MAX_CALLS + 3))
    assert len(await SubmissionReceipts(many, 10.0, wall_s=lambda: 100.0).sweep()) == COMMAND_MEMBERS * SWEEP_MAX_CALLS
    assert many.release_calls == SWEEP_MAX_CALLS and many.stale == 3 * COMMAND_MEMBERS  # the rest: next sweep


def test_an_entry_turns_stale_only_after_the_longest_submission_and_its_confirmation() -> None:
    receipts = SubmissionReceipts(RecordingSet(), longest_submission_s=35.0)
    assert receipts.stale_after_s > 35.0 + 1.0
    assert receipts.sweep_every_s < receipts.stale_after_s

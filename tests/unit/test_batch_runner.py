"""The batch runner (workers/batch_runner.py) on fakes, as httpx tests a client on a mock
transport: a real ModelPool over a fake model client that computes each row's length and
refuses a call holding a ``!fail`` row, and a store and DLQ that record what they are told.
What Triton, Redis and Kafka themselves do is tested against the real ones in
tests/integration/."""

from __future__ import annotations

import pytest

from brimful.workers.batch import Batch, BatchItem
from brimful.workers.batch_runner import BatchRunner
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.shared_rows import ResultCache
from tests.helpers.fake_store import FakeDeadLetters, FakeModel, FakeStore, fake_runner, text_item


def item(n: int, text: str) -> BatchItem:
    return text_item(f"t{n}", text, offset=n)


@pytest.fixture
def parts() -> tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters]:
    return fake_runner(BatchRetryPolicy(max_attempts=2, base_delay=0.0), cache=ResultCache(1 << 20))


async def test_a_partial_batch_is_padded_to_the_model_size_and_each_task_gets_its_own_result(
    parts: tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters],
) -> None:
    runner, model, store, _ = parts
    rows = [item(n, "x" * (n + 1)) for n in range(5)]
    outcome = await runner.run(Batch("b1", 0, rows, "full"))
    assert len(model.calls) == 1 and len(model.calls[0]) == 5  # one call, padding beside 5 real rows
    assert {task_id: outputs["N"] for task_id, outputs in store.done.items()} == {f"t{n}": n + 1 for n in range(5)}
    assert (outcome.done, outcome.failed, outcome.calls) == (5, 0, 1)


async def test_a_failing_row_fails_alone_with_its_dead_letter_written_first(
    parts: tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters],
) -> None:
    runner, _, store, letters = parts
    rows = [item(n, f"row {n}") for n in range(4)] + [item(4, "!fail here")]
    outcome = await runner.run(Batch("b1", 0, rows, "full"))
    assert sorted(store.done) == ["t0", "t1", "t2", "t3"] and list(store.failed) == ["t4"]
    assert store.failed["t4"]["class"] == "model_error" and store.failed["t4"]["batch_id"] == "b1"
    assert [letter.request.task_id for letter in letters.written] == ["t4"]
    assert store.events == ["letter t4", "failed t4"]  # a crash in between repeats it, never loses it
    assert outcome.failed == 1 and outcome.isolation_calls > 0


async def test_identical_tasks_make_one_row_and_a_repeat_makes_no_call(
    parts: tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters],
) -> None:
    runner, model, store, _ = parts
    await runner.run(Batch("b1", 0, [item(0, "same"), item(1, "same"), item(2, "other")], "full"))
    assert model.calls == [[b"same", b"other"]]
    assert store.done["t0"] == store.done["t1"] == {"N": 4}
    await runner.run(Batch("b2", 0, [item(3, "same")], "full"))
    assert len(model.calls) == 1 and store.done["t3"] == {"N": 4}  # answered from the cache


async def test_a_batch_given_up_fails_every_unfinished_task_with_its_letter(
    parts: tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters],
) -> None:
    runner, _, store, letters = parts
    store.done["t0"] = {"N": 1}  # finished before the fault: left as it is
    await runner.abandon(Batch("b1", 0, [item(0, "a"), item(1, "b")], "full"), RuntimeError("store down"))
    assert list(store.failed) == ["t1"] and store.failed["t1"]["class"] == "internal"
    assert [letter.request.task_id for letter in letters.written] == ["t1"]

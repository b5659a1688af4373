"""A task's provenance: what the batch runner stores with its outputs (on the runner's
fakes, see tests/unit/test_batch_runner.py) and how the API shows it. The real store
writing it in Redis is tested in tests/integration/test_provenance.py."""

from __future__ import annotations

import orjson

from brimful.core.task_provenance import STAGES, CallFacts, StoredProvenance, endpoint_id, provenance_answer
from brimful.workers.batch import Batch, BatchItem
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.shared_rows import ResultCache
from tests.helpers.fake_store import fake_runner, text_item

URL = "http://10.1.2.3:8001"


def facts(**changes: object) -> CallFacts:
    base: dict[str, object] = {
        "batch_id": "b7",
        "partition": 3,
        "flush_reason": "deadline",
        "rows": 5,
        "padded_rows": 59,
        "model_calls": 1,
        "endpoint_url": URL,
        "flushed_ns": 1_000_020_000_000,
        "call_started_ns": 1_000_021_000_000,
        "call_ended_ns": 1_000_041_500_000,
    }
    return CallFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_a_stored_provenance_is_whole_json_with_the_task_s_own_arrival() -> None:
    stored = StoredProvenance(facts())
    first, second = orjson.loads(stored.of(1_000_012_000_000)), orjson.loads(stored.of(1_000_015_000_999))
    assert first["arrived_us"] == 1_000_012_000 and second["arrived_us"] == 1_000_015_000
    assert {k: v for k, v in first.items() if k != "arrived_us"} == {
        k: v for k, v in second.items() if k != "arrived_us"
    }
    assert first["endpoint"] == endpoint_id(URL) and first["rows"] + first["padded_rows"] == 64


def test_the_answer_splits_submit_to_stored_into_the_stages_without_naming_the_endpoint_address() -> None:
    stored = orjson.loads(StoredProvenance(facts()).of(1_000_012_000_000))
    answer = provenance_answer(stored, submitted_at_ms=1_000_010, updated_at_ms=1_000_043)
    assert answer["stages_ms"] == {"to_batcher": 2.0, "in_batch": 8.0, "prepare": 1.0, "call": 20.5, "store": 1.5}
    assert list(answer["stages_ms"]) == list(STAGES)
    assert sum(answer["stages_ms"].values()) == 1_000_043 - 1_000_010
    assert (answer["batch_id"], answer["flush_reason"], answer["rows"], answer["padded_rows"]) == (
        "b7",
        "deadline",
        5,
        59,
    )
    assert "10.1.2.3" not in orjson.dumps(answer).decode()


def test_a_clock_skew_or_an_instant_never_recorded_reads_as_a_zero_stage() -> None:
    stored = orjson.loads(StoredProvenance(facts()).of(0))  # no arrival recorded
    answer = provenance_answer(stored, submitted_at_ms=1_000_030, updated_at_ms=1_000_043)  # API's clock ahead
    assert all(value >= 0 for value in answer["stages_ms"].values())
    assert answer["stages_ms"]["to_batcher"] == 0.0


def item(n: int, text: str) -> BatchItem:
    row = text_item(f"t{n}", text, offset=n)
    return BatchItem(row.request, row.partition, row.offset, arrived_ns=5_000_000_000 + n)


async def test_the_runner_stores_each_task_s_call_and_cached_answers_name_no_call() -> None:
    runner, _, store, _ = fake_runner(BatchRetryPolicy(max_attempts=2, base_delay=0.0), cache=ResultCache(1 << 20))
    await runner.run(
        Batch("b1", 2, [item(0, "same"), item(1, "same"), item(2, "other")], "full", flushed_ns=6_000_000_000)
    )
    computed, twin = store.provenance["t0"], store.provenance["t1"]
    assert (computed["batch_id"], computed["partition"], computed["flush_reason"]) == ("b1", 2, "full")
    assert (computed["rows"], computed["padded_rows"], computed["model_calls"]) == (2, 6, 1)  # 2 distinct rows of 8
    assert computed["endpoint"] == endpoint_id("model:8001") and twin["rows"] == 2  # a twin shares its row's call
    assert computed["call_started_us"] >= computed["flushed_us"] == 6_000_000
    await runner.run(Batch("b2", 0, [item(3, "same")], "slot_free", flushed_ns=7_000_000_000))
    from_cache = store.provenance["t3"]
    assert (from_cache["batch_id"], from_cache["rows"], from_cache["model_calls"], from_cache["endpoint"]) == (
        "b2",
        0,
        0,
        "",
    )


async def test_a_failed_row_has_no_provenance_and_its_neighbours_name_the_call_that_computed_them() -> None:
    runner, _, store, _ = fake_runner(BatchRetryPolicy(max_attempts=1, base_delay=0.0))
    await runner.run(Batch("b1", 0, [item(n, f"row {n}") for n in range(3)] + [item(3, "!fail")], "full"))
    assert "t3" not in store.provenance and set(store.provenance) == {"t0", "t1", "t2"}
    for task_id in ("t0", "t1", "t2"):
        stored = store.provenance[task_id]
        # Split to isolate the failing row: each good row names the call that computed it.
        assert stored["model_calls"] > 1 and stored["rows"] < 4
        assert stored["rows"] + stored["padded_rows"] == 8


async def test_with_provenance_off_none_is_stored() -> None:
    runner, _, store, _ = fake_runner(BatchRetryPolicy(max_attempts=2, base_delay=0.0), provenance=False)
    await runner.run(Batch("b1", 0, [item(0, "a"), item(1, "b")], "full"))
    assert set(store.done) == {"t0", "t1"} and store.provenance == {}

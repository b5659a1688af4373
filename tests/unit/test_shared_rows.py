"""Identical tasks computed once (workers/shared_rows.py), on a fake store that records
what it is told: within a batch, across batches of one batcher, through the cache; and a
failure never shared beyond its batch."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from brimful.workers.batch import BatchItem, BatchOutcome
from brimful.workers.shared_rows import ResultCache, SharedRows
from tests.helpers.fake_store import SIGNATURE, FakeStore, text_item


def item(task_id: str, text: str, tenant: str = "acme") -> BatchItem:
    return text_item(task_id, text, tenant)


def encoded(results: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    return {task_id: orjson.dumps(result) for task_id, result in results.items()}


def shared_rows(cache: ResultCache | None = None, across_tenants: bool = False) -> tuple[SharedRows, FakeStore]:
    store = FakeStore()
    return SharedRows(SIGNATURE, store, cache, across_tenants), store  # type: ignore[arg-type]


async def test_identical_tasks_of_one_batch_make_one_row_and_share_its_result() -> None:
    rows, _ = shared_rows()
    outcome = BatchOutcome()
    batch = [item("a", "same"), item("b", "other"), item("c", "same")]
    computed, followers = await rows.answer_identical(batch, outcome)
    assert [row.task_id for row in computed] == ["a", "b"] and followers == []
    results = {"a": {"N": 1}, "b": {"N": 2}}
    shared, twins = rows.computed(outcome, computed, results, encoded(results))
    assert shared == {"c": b'{"N":1}'} and [twin.task_id for twin in twins] == ["c"]


async def test_a_later_batch_waits_for_the_row_a_running_batch_computes() -> None:
    rows, store = shared_rows()
    first, second = BatchOutcome(), BatchOutcome()
    leading, _ = await rows.answer_identical([item("a", "same")], first)
    computed, followers = await rows.answer_identical([item("b", "same"), item("c", "new")], second)
    assert [row.task_id for row in computed] == ["c"] and [f.items[0].task_id for f in followers] == ["b"]
    waiting = asyncio.create_task(rows.follow(followers, second))
    await asyncio.sleep(0)
    assert not waiting.done()  # b waits while a's row is at the model
    rows.computed(first, leading, {"a": {"N": 7}}, encoded({"a": {"N": 7}}))
    assert await waiting == []  # nothing left for b's batch to compute
    assert store.done["b"] == {"N": 7} and "b" in store.cached


async def test_a_failed_or_abandoned_row_sends_its_followers_back_to_compute_it_themselves() -> None:
    rows, store = shared_rows()
    for end in ("failed", "released"):
        first, second = BatchOutcome(), BatchOutcome()
        leading, _ = await rows.answer_identical([item(f"a-{end}", end)], first)
        _, followers = await rows.answer_identical([item(f"b-{end}", end)], second)
        waiting = asyncio.create_task(rows.follow(followers, second))
        if end == "failed":
            assert rows.failed(first, leading) == []
        else:
            rows.release(first)
        orphans = await waiting
        assert [(key, [row.task_id for row in group]) for key, group in orphans] == [(followers[0].key, [f"b-{end}"])]
        assert f"b-{end}" not in store.done  # a failure is never shared beyond its batch
        # ... and the key is free: the follower's batch now leads it.
        assert rows.lead(orphans, second) == followers[0].items
        assert followers[0].key in second.leading


async def test_a_cached_result_answers_at_once_and_only_its_own_tenant() -> None:
    cache = ResultCache(max_bytes=1 << 20)
    rows, store = shared_rows(cache)
    outcome = BatchOutcome()
    computed, _ = await rows.answer_identical([item("a", "x")], outcome)
    rows.computed(outcome, computed, {"a": {"N": 3}}, encoded({"a": {"N": 3}}))
    computed, _ = await rows.answer_identical([item("b", "x"), item("c", "x", tenant="globex")], BatchOutcome())
    assert store.done["b"] == {"N": 3} and "b" in store.cached  # answered from the cache, no row
    assert [row.task_id for row in computed] == ["c"]  # another tenant's identical task is computed


async def test_results_cross_tenants_only_where_allowed() -> None:
    rows, _ = shared_rows(across_tenants=True)
    computed, _ = await rows.answer_identical([item("a", "x"), item("b", "x", tenant="globex")], BatchOutcome())
    assert [row.task_id for row in computed] == ["a"]

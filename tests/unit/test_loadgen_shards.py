"""The load generator's split over processes, its merge, and its follow-up of a 202."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from bench.harness import loadgen
from bench.harness.loadgen import Record, Shard, by_second, follow_up, merged, shard_args
from bench.harness.raw_http import Answer


def _args(**values: object) -> argparse.Namespace:
    return argparse.Namespace(**{"rate": 0.0, "concurrency": 0, "seed": 7, "processes": 3, **values})


def test_clients_are_split_as_evenly_as_whole_clients_allow() -> None:
    shares = [shard_args(_args(concurrency=10), k) for k in range(3)]
    assert [share.concurrency for share in shares] == [4, 3, 3]
    assert [share.seed for share in shares] == [7, 8, 9]  # arrivals do not line up across processes


def test_the_rate_is_split_evenly() -> None:
    assert [shard_args(_args(rate=900.0), k).rate for k in range(3)] == [300.0, 300.0, 300.0]


def test_merged_shards_keep_every_latency_and_count() -> None:
    def shard(latencies: list[float], rows: int, errors: int, first: str) -> Shard:
        record = Record(window=(1.0, 2.0), latencies_ms=latencies, completed_rows_in_window=rows, errors=errors)
        record.finished, record.lost, record.first_error = len(latencies) + errors, 1, first
        return Shard(record, [(1.5, 1.0, 2.0, 3.0)], repeated=2, followed=1)

    both = merged([shard([1.0, 2.0], 2, 0, ""), shard([3.0], 1, 4, "RuntimeError: x")])
    assert sorted(both.record.latencies_ms) == [1.0, 2.0, 3.0]
    assert (both.record.completed_rows_in_window, both.record.errors, both.record.lost) == (3, 4, 2)
    assert (both.record.finished, both.record.first_error) == (7, "RuntimeError: x")
    assert (len(both.inside), both.repeated, both.followed) == (2, 4, 2)


def test_merged_shards_keep_each_latency_with_its_arrival() -> None:
    first = Record(window=(0.0, 1.0), latencies_ms=[5.0], arrived_at=[100.2])
    second = Record(window=(0.0, 1.0), latencies_ms=[7.0, 9.0], arrived_at=[101.5, 100.9])
    both = merged([Shard(first, [], 0, 0), Shard(second, [], 0, 0)]).record
    assert sorted(zip(both.arrived_at, both.latencies_ms)) == [(100.2, 5.0), (100.9, 9.0), (101.5, 7.0)]


def test_the_timeline_groups_requests_by_the_second_they_arrived_in() -> None:
    # Out of order, as answers come back; a second with no arrival has no entry.
    record = Record(
        window=(0.0, 1.0), latencies_ms=[10.0, 300.0, 20.0, 40.0], arrived_at=[1000.9, 1003.1, 1000.1, 1003.8]
    )
    timeline = by_second(record)
    assert [(second["t"], second["n"], second["max_ms"]) for second in timeline] == [(1000, 2, 20.0), (1003, 2, 300.0)]
    assert 20.0 > timeline[0]["p99_ms"] > 10.0
    assert by_second(Record(window=(0.0, 1.0))) == []


def _scripted(answers: list[tuple[int, dict[str, object]]], asked: list[str]) -> loadgen.Call:
    async def call(method: str, target: str, body: bytes) -> Answer:
        asked.append(f"{method} {target}")
        status, answer = answers.pop(0)
        return Answer(status, json.dumps(answer).encode(), None)

    return call


def test_a_202_is_followed_by_long_polls_past_429s_until_final(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "FOLLOW_UP_PAUSE_S", 0.0)
    asked: list[str] = []
    answers = [(429, {}), (200, {"status": "queued"}), (200, {"status": "done", "outputs": {}})]
    status, raw = asyncio.run(follow_up(_scripted(answers, asked), "t1"))
    assert (status, json.loads(raw)["status"]) == (200, "done")
    assert asked == ["GET /v1/tasks/t1?wait=30"] * 3


def test_follow_ups_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "FOLLOW_UP_PAUSE_S", 0.0)
    asked: list[str] = []
    answers = [(429, {})] * (loadgen.FOLLOW_UPS + 5)
    status, _ = asyncio.run(follow_up(_scripted(answers, asked), "t1"))
    assert status == 429 and len(asked) == loadgen.FOLLOW_UPS


def test_a_follow_up_waits_as_retry_after_says(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(loadgen.asyncio, "sleep", pause)
    answers = iter([Answer(429, b"{}", 3.0), Answer(429, b"{}", None), Answer(200, b'{"status": "done"}', None)])

    async def call(method: str, target: str, body: bytes) -> Answer:
        return next(answers)

    status, _ = asyncio.run(follow_up(call, "t1"))
    assert status == 200
    assert pauses == [3.0, loadgen.FOLLOW_UP_PAUSE_S]  # the server's word, else the default


def test_a_closed_loop_longer_than_the_drain_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The clients send for the whole run; only requests still out after it count as lost
    # (the drain once bounded the whole run: a loop past it counted every client lost).
    monkeypatch.setattr(loadgen, "DRAIN_S", 0.1)

    async def send(i: int) -> int:
        await asyncio.sleep(0.01)
        return 1

    record = asyncio.run(loadgen.run_closed(send, concurrency=4, duration=0.4, warmup=0.0))
    assert record.lost == 0
    assert record.completed_rows_in_window > 4 * 0.2 / 0.01 * 0.5  # they went on past the drain's length

"""The API's backlog: each model's consumer lag over its partitions, kept up to date as the
API produces and as the batchers report, read on every POST without any arithmetic over
partitions. Its inputs are stood in for (the board and the counters are plain data)."""

from __future__ import annotations

from typing import Any

from brimful.api.tasks.backlog import RESTART_AFTER_S, BacklogMonitor
from brimful.core.stats import StatsField
from brimful.core.topic_generations import TopicGenerations


class Board:
    def __init__(self) -> None:
        self.batchers: list[dict[str, Any]] = []

    async def read_all(self) -> list[dict[str, Any]]:
        return self.batchers


class Stats:
    async def read(self) -> dict[str, int]:
        return dict.fromkeys(StatsField.ALL, 0)  # every counter, as SharedStats.read gives them


def lag_by_hand(highwater: dict[int, int], produced: dict[int, int], committed: dict[int, int]) -> int:
    partitions = set(highwater) | set(produced)
    return sum(max(0, max(highwater.get(p, 0), produced.get(p, 0)) - max(committed.get(p, 0), 0)) for p in partitions)


async def test_backlog_follows_what_is_produced_and_what_the_batchers_report() -> None:
    board = Board()
    monitor = BacklogMonitor(board, {"requests": ("m", Stats())}, "requests")  # type: ignore[dict-item]
    assert monitor.backlog == 0
    for offset in range(10):
        monitor.produced("requests", 0, offset)
    monitor.produced("requests", 1, 4)
    assert monitor.backlog == 10 + 5  # nobody reported: everything produced is behind

    board.batchers = [
        {"member": "a", "partitions": {"0": {"highwater": 12, "committed": 7}}},
        {"member": "b", "partitions": {"1": {"highwater": 5, "committed": -1}, "2": {"highwater": 3, "committed": 3}}},
    ]
    await monitor.refresh()
    assert monitor.backlog == lag_by_hand({0: 12, 1: 5, 2: 3}, {0: 10, 1: 5}, {0: 7, 2: 3}) == 5 + 5 + 0

    board.batchers[0]["partitions"]["0"] = {"highwater": 12, "committed": 12}
    board.batchers[1]["partitions"]["1"] = {"highwater": 5, "committed": 2}
    await monitor.refresh()
    assert monitor.backlog == 0 + 3 + 0
    monitor.produced("requests", 2, 9)  # the API's own count runs ahead of a stale report
    assert monitor.backlog == 3 + 7

    board.batchers[0]["partitions"]["0"] = {"highwater": 11, "committed": 5}  # an older report moves nothing back
    await monitor.refresh()
    assert monitor.backlog == 3 + 7


async def test_each_models_topic_has_its_own_partitions() -> None:
    # Two models' batchers both own a partition 0: one's committed offset must not be
    # read as the other's, or a model's backlog would hide behind the other's progress.
    board = Board()
    monitor = BacklogMonitor(board, {"requests": ("m", Stats()), "requests.small": ("small", Stats())}, "requests")  # type: ignore[dict-item]
    for offset in range(8):
        monitor.produced("requests", 0, offset)
    for offset in range(3):
        monitor.produced("requests.small", 0, offset)
    assert monitor.backlog == 8 + 3
    board.batchers = [
        {"member": "a", "topic": "requests.small", "partitions": {"0": {"highwater": 3, "committed": 3}}},
        # A batcher of a release that did not name its topic reports the default model's.
        {"member": "b", "partitions": {"0": {"highwater": 8, "committed": 2}}},
    ]
    await monitor.refresh()
    assert monitor.backlog == (8 - 2) + 0
    assert (monitor.backlog_of("requests"), monitor.backlog_of("requests.small")) == (8 - 2, 0)


async def test_a_partition_whose_log_end_stays_below_its_committed_offset_starts_over() -> None:
    # The topic deleted and created again: its batchers report a new, short log. A report
    # like that for a moment is a stale one and moves nothing back; for RESTART_AFTER_S it
    # is the new log, and the backlog follows it instead of staying up for ever.
    now = [0.0]
    board = Board()
    monitor = BacklogMonitor(board, {"requests": ("m", Stats())}, "requests", clock=lambda: now[0])  # type: ignore[dict-item]
    for offset in range(500):
        monitor.produced("requests", 0, offset)
    board.batchers = [{"member": "a", "partitions": {"0": {"highwater": 500, "committed": 100}}}]
    await monitor.refresh()
    assert monitor.backlog_of("requests") == 400
    board.batchers = [{"member": "a", "partitions": {"0": {"highwater": 30, "committed": 20}}}]
    for at in (1.0, 1.0 + RESTART_AFTER_S - 0.1):
        now[0] = at
        await monitor.refresh()
        assert monitor.backlog_of("requests") == 400
    now[0] = 1.0 + RESTART_AFTER_S
    await monitor.refresh()
    assert monitor.backlog_of("requests") == 30 - 20
    monitor.produced("requests", 0, 31)  # the API's own count of the new log
    assert monitor.backlog_of("requests") == 32 - 20


async def test_a_models_backlog_spans_its_topic_generations_and_retired_ones_are_forgotten() -> None:
    generations = TopicGenerations("requests", period_s=10.0, lead_s=5.0, grace_s=20.0)
    now = [1000.0]
    board = Board()
    monitor = BacklogMonitor(
        board,
        {"requests": ("m", Stats())},  # type: ignore[dict-item]
        "requests",
        generations={"requests": generations},
        wall_clock=lambda: now[0],
    )
    for offset in range(6):
        monitor.produced("requests.g99", 0, offset)
    for offset in range(4):
        monitor.produced("requests.g100", 0, offset)
    assert monitor.backlog_of("requests") == 6 + 4
    board.batchers = [
        {"member": "a.g99", "topic": "requests.g99", "partitions": {"0": {"highwater": 6, "committed": 5}}},
        {"member": "a.g100", "topic": "requests.g100", "partitions": {"0": {"highwater": 4, "committed": 1}}},
    ]
    await monitor.refresh()
    assert monitor.backlog_of("requests") == 1 + 3
    board.batchers = board.batchers[1:]  # generation 99's members left
    await monitor.refresh()
    assert monitor.backlog_of("requests") == 1 + 3  # not retired yet: it may still be consumed
    now[0] = generations.ends_at(99) + generations.grace_s
    await monitor.refresh()
    assert monitor.backlog_of("requests") == 3  # deleted with its topic
    assert {partition[0] for partition in monitor._lag} == {"requests.g100"}

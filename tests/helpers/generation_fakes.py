"""What the generations' unit tests stand in for a generation's service and consumer:
the pure decisions of ``batcher/generations.py`` read only these of them."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from brimful.batcher.generations import GenerationRun, Generations
from brimful.core.topic_generations import TopicGenerations

PARTITIONS = 4  # of each generation's topic


@dataclass
class FakeService:
    running: bool = False
    exports_gauges: bool = False
    settled: bool = False  # never retires here

    def pace_fetches(self, wait_ms: int) -> bool:
        return True


@dataclass
class FakeConsumer:
    """A group member's view: what it holds, each partition's end and committed offset,
    and how many committed offsets it asked the broker for."""

    topic: str
    held: set[int] = field(default_factory=set)
    end: int = 50
    committed_to: int = 50
    asked: int = 0

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(self.topic, p) for p in self.held}

    def highwater(self, tp: TopicPartition) -> int:
        return self.end

    async def committed(self, tp: TopicPartition) -> int:
        self.asked += 1
        return self.committed_to

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))


async def nothing(*_: object) -> None:
    return None


@dataclass
class FakeFactory:
    """A generation factory of two functions: one opens (number, topic), one runs."""

    opens: Callable[[int, str], tuple[Any, Any]]
    runs: Callable[[GenerationRun], Coroutine[Any, Any, None]]

    def open(self, number: int, topic: str, current: GenerationRun | None) -> tuple[Any, Any]:
        return self.opens(number, topic)

    async def run(self, run: GenerationRun) -> None:
        await self.runs(run)


def fake_generations(
    topics: TopicGenerations,
    open_generation: Callable[[int, str], tuple[Any, Any]],
    run_generation: Callable[[GenerationRun], Coroutine[Any, Any, None]],
    clock: list[float],
    existing: set[str] | None = None,
    held: set[int] | None = None,
) -> Generations:
    """Generations on a virtual wall clock (``clock[0]``) whose broker lists ``existing``
    topics and whose status board shows ``held`` generations held by live batchers (both
    read at each turn, so a test may change them); creating and deleting topics do nothing."""

    async def list_topics() -> set[str]:
        return set(existing or ())

    async def held_by_live_batchers() -> set[int]:
        return set(held or ())

    return Generations(
        topics,
        FakeFactory(open_generation, run_generation),
        list_topics=list_topics,
        create_topics=nothing,
        delete_topic=nothing,
        held_by_live_batchers=held_by_live_batchers,
        wall_clock=lambda: clock[0],
        live_fetch_wait_ms=5,
    )

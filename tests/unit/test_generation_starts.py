"""A generation whose consumer cannot start (the broker away) is started again on the next
turn, not the end of the batcher; only a broker away past ``START_PATIENCE_S``, with no
generation consuming, ends it. The runner here stands in for the consumer's start: the
real broker's side is tests/faults/test_topic_rotation.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from brimful.batcher.generations import START_PATIENCE_S, GenerationNotStarted, GenerationRun, Generations
from brimful.core.topic_generations import TopicGenerations
from tests.helpers.generation_fakes import FakeConsumer, FakeService, fake_generations


@dataclass
class Broker:
    """Whether a consumer's start succeeds, and the starts asked for, by generation."""

    up: bool = False
    starts: list[int] = field(default_factory=list)


ONE_TOPIC = TopicGenerations("brimful.requests")  # one generation: the process's only consumer
ROTATING = TopicGenerations("brimful.requests", period_s=10.0, lead_s=5.0, grace_s=30.0)


def generations(broker: Broker, clock: list[float], topics: TopicGenerations = ONE_TOPIC) -> Generations:
    def open_generation(number: int, topic: str) -> tuple[Any, Any]:
        return FakeConsumer(topic), FakeService()

    async def run_generation(run: GenerationRun) -> None:
        broker.starts.append(run.number)
        if not broker.up:
            raise GenerationNotStarted(run.topic)
        cast(FakeService, run.service).running = True
        await run.stop.wait()

    return fake_generations(topics, open_generation, run_generation, clock)


async def turn(subject: Generations) -> None:
    await subject._turn()
    await asyncio.sleep(0)  # the started run reaches its consumer's start


async def test_a_generation_that_could_not_start_is_started_again_on_the_next_turn() -> None:
    broker, clock = Broker(), [1000.0]
    subject = generations(broker, clock)
    for _ in range(3):
        await turn(subject)
        clock[0] += 1.0
    assert broker.starts == [0, 0, 0]  # tried once a turn, never retired
    broker.up = True
    await turn(subject)
    await turn(subject)
    assert broker.starts == [0, 0, 0, 0]
    assert subject.running[0].service.running
    for run in subject.running.values():
        run.stop.set()


async def test_a_broker_away_past_the_patience_ends_the_process() -> None:
    broker, clock = Broker(), [1000.0]
    subject = generations(broker, clock)
    await turn(subject)
    while clock[0] - 1000.0 <= START_PATIENCE_S:
        await turn(subject)  # collects the failed start (within patience) and starts it again
        clock[0] += 5.0
    with pytest.raises(GenerationNotStarted):
        await turn(subject)


async def test_while_a_generation_consumes_new_ones_are_tried_for_as_long_as_the_broker_is_away() -> None:
    broker, clock = Broker(up=True), [1000.0]
    subject = generations(broker, clock, ROTATING)
    await turn(subject)
    assert subject.running[100].service.running  # the current generation consumes
    broker.up = False
    for _ in range(2 * int(START_PATIENCE_S / 5)):  # twice the patience, a turn every 5 s
        clock[0] += 5.0
        await turn(subject)
    later = set(broker.starts) - {100}
    assert later == set(range(101, ROTATING.generation_at(clock[0] + ROTATING.lead_s) + 1))
    assert broker.starts.count(105) >= 2  # a failed one is tried again, not retired
    broker.up = True
    await turn(subject)
    await turn(subject)
    assert subject.running[ROTATING.generation_at(clock[0])].service.running
    for run in subject.running.values():
        run.stop.set()

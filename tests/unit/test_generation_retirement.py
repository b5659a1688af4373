"""Who leaves a finished topic generation, and when: a member that does not hold
partition 0 leaves once the generation is past its end and its partitions have stayed
drained for ``DRAINED_FOR_S``; the keeper (partition 0's holder) stays through the grace,
asks the broker nothing meanwhile, and leaves only holding every partition, deleting the
topic. The consumer here stands in for the group's assignment and offsets; the real
broker's side is tests/faults/test_topic_rotation.py."""

from __future__ import annotations

import asyncio
from typing import Any

from brimful.batcher.generations import DRAINED_FOR_S, LIVE_MARGIN_S, GenerationRun, Generations
from brimful.core.topic_generations import TopicGenerations
from tests.helpers.generation_fakes import PARTITIONS, FakeConsumer, FakeService, fake_generations

ROTATING = TopicGenerations("brimful.requests", period_s=10.0, lead_s=5.0, grace_s=30.0)
GENERATION = 100  # sends choose it from 1000.0 to 1010.0


def generations(clock: list[float], consumers: dict[int, FakeConsumer]) -> Generations:
    def open_generation(number: int, topic: str) -> tuple[Any, Any]:
        consumers[number] = FakeConsumer(topic)
        return consumers[number], FakeService(running=True, settled=True)

    async def run_generation(run: GenerationRun) -> None:
        await run.stop.wait()

    return fake_generations(ROTATING, open_generation, run_generation, clock)


async def joined_with(held: set[int]) -> tuple[Generations, FakeConsumer, list[float]]:
    """A batcher that joined GENERATION while it was live and holds ``held`` of it."""
    clock = [1000.0]
    consumers: dict[int, FakeConsumer] = {}
    subject = generations(clock, consumers)
    await subject._turn()
    consumers[GENERATION].held = held
    return subject, consumers[GENERATION], clock


async def turns_until(subject: Generations, clock: list[float], until: float) -> None:
    while clock[0] < until:
        clock[0] += 0.5
        await subject._turn()


async def stop_all(subject: Generations) -> None:
    for run in subject.running.values():
        run.stop.set()
    await asyncio.gather(*(run.task for run in subject.running.values() if run.task is not None))


async def test_a_member_without_partition_0_leaves_soon_after_the_end_not_after_the_grace() -> None:
    subject, consumer, clock = await joined_with({2, 3})
    run = subject.running[GENERATION]
    end = ROTATING.ends_at(GENERATION)
    await turns_until(subject, clock, end)
    assert not run.stop.is_set() and consumer.asked == 0  # sends still choose it: not even looked at
    await turns_until(subject, clock, end + LIVE_MARGIN_S + DRAINED_FOR_S + 1.0)
    assert run.stop.is_set() and not run.deletes_topic
    assert clock[0] < end + ROTATING.grace_s
    await stop_all(subject)


async def test_a_member_with_records_not_committed_stays() -> None:
    subject, consumer, clock = await joined_with({2, 3})
    consumer.committed_to = consumer.end - 1
    await turns_until(subject, clock, ROTATING.ends_at(GENERATION) + 3 * DRAINED_FOR_S)
    assert not subject.running[GENERATION].stop.is_set()
    consumer.committed_to = consumer.end  # its last batch finished
    left_at = clock[0]
    await turns_until(subject, clock, left_at + DRAINED_FOR_S + 1.0)
    assert subject.running[GENERATION].stop.is_set()
    await stop_all(subject)


async def test_the_keeper_stays_through_the_grace_asking_nothing_then_takes_every_partition_and_deletes() -> None:
    subject, consumer, clock = await joined_with({0, 1})
    run = subject.running[GENERATION]
    grace_end = ROTATING.ends_at(GENERATION) + ROTATING.grace_s
    await turns_until(subject, clock, grace_end - 0.5)
    assert not run.stop.is_set()
    assert consumer.asked == 0  # no committed offsets asked for while late sends may come
    await turns_until(subject, clock, grace_end + 2 * DRAINED_FOR_S)
    assert not run.stop.is_set()  # another member still holds partitions 2 and 3
    consumer.held = set(range(PARTITIONS))  # the others have left: the group gave it all
    handed_at = clock[0]
    await turns_until(subject, clock, handed_at + DRAINED_FOR_S - 0.5)
    assert not run.stop.is_set()  # the new assignment's drained spell starts over
    await turns_until(subject, clock, handed_at + DRAINED_FOR_S + 1.0)
    assert run.stop.is_set() and run.deletes_topic
    await stop_all(subject)

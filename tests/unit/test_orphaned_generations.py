"""An older topic generation is joined only once the status board has shown no live
batcher holding it for ``ORPHANED_FOR_S``; one that live batchers hold is left to them
(a join is a rebalance of their group, and joins under faults kept generations from
retiring). The board's real side (entries that expire with their batcher) is
tests/integration/test_status_board.py; the broker's is tests/faults/test_topic_rotation.py."""

from __future__ import annotations

import asyncio
from typing import Any

from brimful.batcher.generations import GenerationRun
from brimful.batcher.orphans import ORPHANED_FOR_S, OrphanWatch
from brimful.core.topic_generations import TopicGenerations
from tests.helpers.generation_fakes import FakeConsumer, FakeService, fake_generations

ROTATING = TopicGenerations("brimful.requests", period_s=10.0, lead_s=5.0, grace_s=30.0)


def test_a_generation_no_live_batcher_holds_is_joined_once_it_has_been_so_for_the_wait() -> None:
    watch = OrphanWatch()
    assert watch.to_join(100.0, {7, 8}, held={8}) == set()
    assert watch.to_join(100.0 + ORPHANED_FOR_S - 0.1, {7, 8}, held={8}) == set()
    assert watch.to_join(100.0 + ORPHANED_FOR_S, {7, 8}, held={8}) == {7}


def test_a_batcher_seen_holding_it_again_starts_the_wait_over() -> None:
    watch = OrphanWatch()
    watch.to_join(100.0, {7}, held=set())
    watch.to_join(103.0, {7}, held={7})  # an entry between two refreshes, back
    watch.to_join(104.0, {7}, held=set())
    assert watch.to_join(100.0 + ORPHANED_FOR_S, {7}, held=set()) == set()
    assert watch.to_join(104.0 + ORPHANED_FOR_S, {7}, held=set()) == {7}


def test_an_unread_board_joins_nothing_and_starts_the_wait_over() -> None:
    watch = OrphanWatch()
    watch.to_join(100.0, {7}, held=set())
    assert watch.to_join(100.0 + ORPHANED_FOR_S, {7}, held=None) == set()
    assert watch.to_join(101.0 + ORPHANED_FOR_S, {7}, held=set()) == set()
    assert watch.to_join(101.0 + 2 * ORPHANED_FOR_S, {7}, held=set()) == {7}


async def test_a_started_batcher_leaves_held_older_generations_to_their_batchers_and_takes_orphans() -> None:
    clock = [1000.0]  # generation 100 is current
    existing = {ROTATING.topic(n) for n in (96, 97, 98, 99, 100)}
    held = {97, 98, 99, 100, 101}  # 96's last batcher died
    joined: list[int] = []

    def open_generation(number: int, topic: str) -> tuple[Any, Any]:
        joined.append(number)
        return FakeConsumer(topic), FakeService(running=True)

    async def run_generation(run: GenerationRun) -> None:
        await run.stop.wait()

    subject = fake_generations(ROTATING, open_generation, run_generation, clock, existing, held)
    await subject._turn()
    assert joined == [100]  # the live one at once; no older one yet
    clock[0] += ORPHANED_FOR_S
    await subject._turn()
    assert joined == [100, 96, 101]  # the orphan once it has been one for the wait; the next within its lead
    held.discard(98)  # 98's batchers die too
    clock[0] += 1.0
    await subject._turn()
    assert joined == [100, 96, 101]  # not yet
    clock[0] += ORPHANED_FOR_S
    await subject._turn()
    assert joined == [100, 96, 101, 98]
    assert sorted(subject.running) == [96, 98, 100, 101]
    for run in subject.running.values():
        run.stop.set()
    await asyncio.gather(*(run.task for run in subject.running.values() if run.task is not None))

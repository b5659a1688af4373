"""The fetch wait: doubled while lagging with nothing fetched, kept while catching up,
back to its base once caught up; a new base taken at once, or once caught up. The pacer
that applies it keeps a base set from outside through a lagging spell."""

import asyncio
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition

from brimful.core.fetch_pacer import FetchPacer
from brimful.core.fetch_wait import FetchWait


def test_empty_fetches_while_lagging_double_the_wait_up_to_its_ceiling() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    waits = [wait.after_fetch(got_records=False, lagging=True) for _ in range(10)]
    assert waits == [40, 80, 160, 320, 640, 1280, 2560, 4000, 4000, 4000]


def test_records_while_still_lagging_keep_the_wait_and_catching_up_resets_it() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    for _ in range(4):
        wait.after_fetch(got_records=False, lagging=True)
    assert wait.after_fetch(got_records=True, lagging=True) == 320
    assert wait.after_fetch(got_records=True, lagging=False) == 20


def test_an_idle_consumer_keeps_its_base_wait() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    assert [wait.after_fetch(got_records=False, lagging=False) for _ in range(3)] == [20, 20, 20]


def test_a_zero_base_still_grows() -> None:
    wait = FetchWait(base_ms=0, ceiling_ms=100)
    assert [wait.after_fetch(got_records=False, lagging=True) for _ in range(3)] == [1, 2, 4]


def test_a_ceiling_below_the_base_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        FetchWait(base_ms=500, ceiling_ms=100)


def test_a_new_base_is_taken_at_once_while_caught_up_and_after_catching_up_while_lagging() -> None:
    wait = FetchWait(base_ms=5, ceiling_ms=4000)
    assert wait.rebase(250) == 250
    assert wait.after_fetch(got_records=False, lagging=False) == 250
    for _ in range(3):
        wait.after_fetch(got_records=False, lagging=True)
    assert wait.current_ms == 2000
    assert wait.rebase(5) == 2000  # still lagging: the longer wait stays
    assert wait.after_fetch(got_records=True, lagging=False) == 5
    assert wait.rebase(9000) == 4000  # never past the ceiling


@dataclass
class Fetcher:
    _fetch_max_wait_ms: int = 5


@dataclass
class Consumer:
    """What the pacer reads of a consumer: one partition, its high watermark and position."""

    highwater_at: int = 0
    position_at: int = 0
    _fetcher: Fetcher | None = field(default_factory=Fetcher)  # None: not started

    def paused(self) -> set[TopicPartition]:
        return set()

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t.g1", 0)}

    def highwater(self, tp: TopicPartition) -> int:
        return self.highwater_at

    async def position(self, tp: TopicPartition) -> int:
        return self.position_at


def test_a_base_set_from_outside_outlives_a_lagging_spell() -> None:
    # A topic generation no send goes to fetches at a long idle wait. Set beside the
    # pacer, that wait was undone when the pacer came back to its own base after rows were
    # read again (a rebalance): the generation then fetched at the live wait for good.
    consumer = Consumer()
    pacer = FetchPacer(consumer, 5, 4000, "test")  # type: ignore[arg-type]
    assert pacer.set_base(250) and waits(consumer) == 250

    async def spell() -> None:
        consumer.highwater_at = 100  # records past the position, fetches empty: lagging
        for _ in range(3):
            await pacer.after_fetch({})
        assert waits(consumer) == 2000
        consumer.position_at = 100  # caught up
        await pacer.after_fetch({})

    asyncio.run(spell())
    assert waits(consumer) == 250


def waits(consumer: Consumer) -> int:
    """The wait the consumer's fetcher asks for."""
    assert consumer._fetcher is not None
    return consumer._fetcher._fetch_max_wait_ms


def test_a_base_set_before_the_consumer_starts_is_taken_after_its_first_fetch() -> None:
    # A topic generation is paced as it is joined, before its consumer has started: that
    # wait was taken for one this aiokafka cannot change and dropped for good, and each
    # generation joined ahead of its start fetched at the live wait all its life.
    consumer = Consumer(_fetcher=None)
    pacer = FetchPacer(consumer, 5, 4000, "test")  # type: ignore[arg-type]
    assert pacer.set_base(250)
    consumer._fetcher = Fetcher(5)  # started, with the wait it was built with
    asyncio.run(pacer.after_fetch({}))
    assert waits(consumer) == 250
    assert pacer.set_base(5) and waits(consumer) == 5  # and it follows later changes

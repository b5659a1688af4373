"""The batcher's services, one per generation of its model's requests topic.

Without rotation there is one generation, the model's topic itself, consumed for the
life of the process. With rotation (``core/topic_generations.py``) each generation gets
its own consumer, consumer group and :class:`~brimful.batcher.service.BatcherService`,
sharing the process's model pool, runner and Redis: the next one is joined before sends
reach it, so a new generation never pauses the current one for a rebalance.

A generation is retired member by member once its sends are over and every record in
it is committed. A member that does not hold partition 0 leaves soon after the
generation's end: its partitions go to the others, and a send that lands late is read
by whoever holds it then. The member holding partition 0, the keeper, stays through the
grace (``may_retire``), until every other member has left and it holds every
partition; then it leaves and deletes the topic, which frees the broker's memory. So a
finished generation costs one consumer and service among all the batchers for its grace,
not one a batcher. An older generation is joined only where no live batcher holds it
(``batcher/orphans.py``: its last member died with records waiting, or before it
deleted the topic) and is retired the same way.

A generation whose consumer cannot start (the broker away: with rotation a new one starts
every period, so a broker restart meets one) is started again on the next turn. Only
failing for ``START_PATIENCE_S`` with no generation of the process consuming ends it, as
any failed service does, for its supervisor to start again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from brimful.batcher.orphans import OrphanWatch
from brimful.batcher.service import BatcherService
from brimful.core.topic_generations import SUFFIX, TopicGenerations

log = logging.getLogger("brimful.batcher")

# The fetch wait of a generation no send goes to (before its start, after its end): a
# consumer per generation fetching every few ms, times the generations kept for their
# grace, cost the broker and this process more than the current one's traffic. A send
# that lands late waits this much longer.
IDLE_FETCH_WAIT_MS = 250
# A generation fetches at the live wait from this long before its start to this long after its end.
LIVE_MARGIN_S = 1.5
# How long a member must find its partitions drained, turn after turn with no rebalance,
# before it leaves a generation: a broker answering oddly for a moment (just restarted)
# must not end one.
DRAINED_FOR_S = 5.0
# How long generations may keep failing to start, with none of this process's consuming,
# before the failure is raised.
START_PATIENCE_S = 60.0


class GenerationNotStarted(Exception):
    """Raised by a :data:`Runner` whose generation's consumer could not start (the broker
    away); the generation is tried again on a later turn."""


@dataclass
class GenerationRun:
    """One generation's service while it runs."""

    number: int
    topic: str
    consumer: AIOKafkaConsumer
    service: BatcherService
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    deletes_topic: bool = False  # set when it retires as the topic's last member
    drained_since: float | None = None  # found drained on every turn since (wall clock)
    drained_of: frozenset[TopicPartition] = frozenset()  # holding these partitions all along


class GenerationFactory(Protocol):
    """What makes and runs one generation's consumer and service (``batcher/main.py``'s,
    with the process's parts; the unit tests' fakes)."""

    def open(self, number: int, topic: str, current: GenerationRun | None) -> tuple[AIOKafkaConsumer, BatcherService]:
        """Build a generation's consumer and service, not started; a new generation starts
        with the live policy of ``current``, the one sends go to now."""

    async def run(self, run: GenerationRun) -> None:
        """Run a generation's service until its stop event is set, closing its consumer
        after; GenerationNotStarted where its consumer could not start."""


async def drained(consumer: AIOKafkaConsumer) -> bool:
    """Whether every partition this member holds is committed to its end (as the last
    fetch saw it). The committed offset is the broker's: a record counts only once its
    task is final and its offset committed."""
    for tp in consumer.assignment():
        highwater = consumer.highwater(tp)
        if highwater is None:
            return False  # no fetch answered yet
        committed = await consumer.committed(tp)
        if (committed or 0) < highwater:
            return False
    return True


def holds_every_partition(consumer: AIOKafkaConsumer, topic: str) -> bool:
    partitions = consumer.partitions_for_topic(topic) or set()
    return bool(partitions) and consumer.assignment() >= {TopicPartition(topic, p) for p in partitions}


class Generations:
    """Starts and retires this batcher's generation services."""

    def __init__(
        self,
        generations: TopicGenerations,
        factory: GenerationFactory,
        list_topics: Callable[[], Awaitable[set[str]]],
        create_topics: Callable[[list[str]], Awaitable[None]],
        delete_topic: Callable[[str], Awaitable[None]],
        held_by_live_batchers: Callable[[], Awaitable[set[int]]],
        wall_clock: Callable[[], float],
        live_fetch_wait_ms: int,
        interval_s: float = 1.0,
    ) -> None:
        self._generations = generations
        self._factory = factory
        self._list_topics = list_topics
        self._create_topics = create_topics
        self._delete_topic = delete_topic
        self._held_by_live_batchers = held_by_live_batchers
        self._orphans = OrphanWatch()
        self._wall_clock = wall_clock
        self._live_fetch_wait_ms = live_fetch_wait_ms
        self._interval_s = interval_s
        self.running: dict[int, GenerationRun] = {}
        # Retired here, and when (``_retired_lately``).
        self._retired: dict[int, float] = {}
        # Since when generations have failed to start with none consuming (None: not failing).
        self._failing_since: float | None = None

    @property
    def current(self) -> GenerationRun | None:
        """The service of the generation sends go to now (or the newest running)."""
        if not self.running:
            return None
        now = self._generations.generation_at(self._wall_clock())
        return self.running.get(now) or self.running[max(self.running)]

    def member_name(self, member: str, number: int) -> str:
        """A generation's entry on the status board (the member's name without rotation)."""
        return f"{member}{SUFFIX}{number}" if self._generations.rotating else member

    @property
    def services(self) -> list[BatcherService]:
        return [run.service for run in self.running.values()]

    def cancel(self, task_id: str) -> bool:
        """Drop a cancelled task from whichever generation holds it waiting."""
        return any(service.cancel(task_id) for service in self.services)

    def endpoint_down(self, url: str) -> None:
        """Another batcher found ``url`` down: every generation stops sending to it."""
        for service in self.services:
            service.health.endpoint_down(url)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the wanted generations running until ``stop``; then stop them all (each
        flushes what waits and drains its in-flight work)."""
        try:
            while not stop.is_set():
                await self._turn()
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
                except TimeoutError:
                    pass
        finally:
            for run in self.running.values():
                run.stop.set()
            tasks = [run.task for run in self.running.values() if run.task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _turn(self) -> None:
        now = self._wall_clock()
        await self._reap()
        existing: set[str] = set()
        if self._generations.rotating:
            try:
                existing = await self._list_topics()
                missing = [topic for topic in self._generations.upcoming(now) if topic not in existing]
                if missing:  # before sends reach them (the API creates them too)
                    await self._create_topics(missing)
                    existing.update(missing)
            except Exception as error:  # the broker away: keep what runs, try next turn
                log.warning("could not list topic generations", extra={"error": repr(error)})
        joining = self._generations.live(now) | await self._orphans_to_join(now, existing)
        for number in sorted(joining - set(self.running)):
            if not self._retired_lately(number, now):
                self._start(number)
        current = self._generations.generation_at(now)
        for number, run in self.running.items():
            run.service.exports_gauges = number == current or (
                current not in self.running and number == max(self.running)
            )
            self._pace(run, now)
            if not run.stop.is_set() and now >= self._generations.ends_at(number) + LIVE_MARGIN_S:
                await self._maybe_retire(run, now)

    async def _orphans_to_join(self, now: float, existing: set[str]) -> set[int]:
        """The older generations no live batcher has held for a while (none without rotation).
        Those this batcher runs or retired lately are left out first: most turns then
        have none, and the board is not read."""
        older = {
            number
            for number in self._generations.older(now, existing) - set(self.running)
            if not self._retired_lately(number, now)
        }
        if not older:
            return self._orphans.to_join(now, older, set())
        try:
            held: set[int] | None = await self._held_by_live_batchers()
        except Exception as error:  # the board away: join nothing new this turn
            log.warning("could not read which generations live batchers hold", extra={"error": repr(error)})
            held = None
        return self._orphans.to_join(now, older, held)

    def _retired_lately(self, number: int, now: float) -> bool:
        """Retired here within the grace: not joined again, so the member that stays to
        delete its topic ends up holding all of it."""
        retired_at = self._retired.get(number)
        return retired_at is not None and now - retired_at < self._generations.grace_s

    def _pace(self, run: GenerationRun, now: float) -> None:
        """The live fetch wait while sends go to the generation, the idle one otherwise."""
        if not self._generations.rotating:
            return
        starts_at = self._generations.ends_at(run.number - 1)
        live = starts_at - LIVE_MARGIN_S <= now < self._generations.ends_at(run.number) + LIVE_MARGIN_S
        # Never below the live wait: some brokers answer a shorter one with nothing (Tansu on S3).
        wait_ms = self._live_fetch_wait_ms if live else max(IDLE_FETCH_WAIT_MS, self._live_fetch_wait_ms)
        # Through the service's pacer, the wait's one owner (a wait unchanged costs nothing
        # there): a wait set beside it was undone the next time the pacer dropped back to
        # its base, and an old generation that had lagged once (rows read again after a
        # rebalance) then fetched at the live wait for the rest of its life.
        run.service.pace_fetches(wait_ms)

    def _start(self, number: int) -> None:
        topic = self._generations.topic(number)
        consumer, service = self._factory.open(number, topic, self.current)
        run = GenerationRun(number, topic, consumer, service)
        run.task = asyncio.create_task(self._factory.run(run), name=f"brimful-generation-{number}")
        self.running[number] = run
        log.info("joined a topic generation", extra={"topic": topic})

    async def _maybe_retire(self, run: GenerationRun, now: float) -> None:
        """Leave a generation past its end once this member's partitions have stayed
        drained for ``DRAINED_FOR_S``; the keeper (partition 0's holder) only past the
        grace, holding every partition, and it deletes the topic."""
        keeper = TopicPartition(run.topic, 0) in run.consumer.assignment()
        if keeper and not self._generations.may_retire(run.number, now):
            run.drained_since = None  # late sends may still come: its drained spell starts after the grace
            return
        # A member between an assignment's revocation and the next holds nothing, and its
        # empty hold looks drained: it must not leave, or a rebalance could empty the group.
        if not run.service.running or not run.service.settled or not await drained(run.consumer):
            run.drained_since = None
            return
        held = frozenset(run.consumer.assignment())
        if run.drained_since is None or held != run.drained_of:  # a rebalance between turns starts it over
            run.drained_since, run.drained_of = now, held
        if now - run.drained_since < DRAINED_FOR_S or not run.service.settled:
            return
        if keeper:
            if not holds_every_partition(run.consumer, run.topic):
                return  # stays until the others have left, then deletes the topic
            run.deletes_topic = True
        log.info("retiring a topic generation", extra={"topic": run.topic, "deletes": run.deletes_topic})
        run.stop.set()

    async def _reap(self) -> None:
        """Collect finished generations: a service that raised raises here; the last
        member deletes its topic once its consumer has left the group (a consumer still
        in it could create the topic again by asking for it)."""
        if any(run.service.running for run in self.running.values()):
            self._failing_since = None  # the broker answers: patience starts over
        for number, run in list(self.running.items()):
            if run.task is None or not run.task.done():
                continue
            del self.running[number]
            try:
                run.task.result()
            except GenerationNotStarted as error:
                now = self._wall_clock()
                self._failing_since = self._failing_since or now
                if now - self._failing_since > START_PATIENCE_S:
                    raise
                # Not retired: the next turn starts it again.
                log.warning(
                    "could not start a topic generation; trying again", extra={"topic": run.topic, "error": repr(error)}
                )
                continue
            self._retired[number] = self._wall_clock()
            if run.deletes_topic:
                try:
                    await self._delete_topic(run.topic)
                    log.info("deleted a finished topic generation", extra={"topic": run.topic})
                except Exception as error:  # joined again and deleted on a later turn
                    log.warning("could not delete a topic generation", extra={"topic": run.topic, "error": repr(error)})
        horizon = self._wall_clock() - 2 * self._generations.grace_s
        for number in [n for n, at in self._retired.items() if at < horizon]:
            del self._retired[number]

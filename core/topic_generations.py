"""Topic generations: a requests topic that rotates, so a broker without retention holds
only recent records.

With ``topic_rotation_s`` set, a model's tasks go to ``<its topic>.g<N>``, where N is the
wall-clock second divided by the period: every API worker picks the same generation with
no coordination. Batchers consume the live generations (each through its own consumer
group, so a new generation never rebalances the current one), join the next one
``lead_s`` before it starts, join an older one only where no live batcher holds it, and
retire a generation once it is past its end by ``grace_s`` and every record in it is
finished; the last member deletes its topic, which frees the broker's memory (Tansu's
memory engine keeps every record and lists them all on each fetch).

The grace covers sends begun before the end: a send that began at the end of its
generation has come back, or failed, within the producer's request timeout, and hosts'
clocks are taken to agree within a few seconds. With ``period_s`` 0 there is one topic
for ever, named as before (Apache Kafka has retention of its own).

Pure: the live code passes ``now`` in (wall-clock seconds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

SUFFIX = ".g"  # between a model's topic and its generation number
# The period the embedded broker was measured with under sustained load
# (bench/results/sustained.md): BRIMFUL_TOPIC_ROTATION_S=10.
MEASURED_PERIOD_S = 10.0


@dataclass(frozen=True)
class TopicGenerations:
    """The generations of one model's requests topic."""

    base: str  # the model's requests topic; with no rotation, the one topic
    period_s: float = 0.0  # 0: no rotation
    lead_s: float = 10.0  # batchers join a generation this long before it starts
    grace_s: float = 60.0  # a generation is kept this long after it ends

    @property
    def rotating(self) -> bool:
        return self.period_s > 0

    def generation_at(self, now: float) -> int:
        """The generation a task sent at ``now`` goes to (0 without rotation)."""
        return math.floor(now / self.period_s) if self.rotating else 0

    def topic(self, generation: int) -> str:
        """The topic of one generation (the base topic without rotation)."""
        return f"{self.base}{SUFFIX}{generation}" if self.rotating else self.base

    def topic_at(self, now: float) -> str:
        """The topic a task sent at ``now`` goes to."""
        return self.topic(self.generation_at(now))

    def generation_of(self, topic: str) -> int | None:
        """The generation ``topic`` holds, or None when it is not one of this model's
        generations (another model's topic shares the prefix but not the form)."""
        if not self.rotating:
            return 0 if topic == self.base else None
        prefix = self.base + SUFFIX
        if not topic.startswith(prefix):
            return None
        number = topic[len(prefix) :]
        return int(number) if number.isdigit() else None

    def ends_at(self, generation: int) -> float:
        """When sends stop choosing ``generation`` (infinity without rotation)."""
        return (generation + 1) * self.period_s if self.rotating else math.inf

    def live(self, now: float) -> set[int]:
        """The generations every batcher consumes at ``now``: the current one and the next
        once it is within ``lead_s`` (0 alone without rotation)."""
        if not self.rotating:
            return {0}
        return {self.generation_at(now), self.generation_at(now + self.lead_s)}

    def older(self, now: float, existing: Iterable[str]) -> set[int]:
        """The generations before the current one whose topics still exist: they may hold
        unfinished records, or wait for their last member to delete them."""
        if not self.rotating:
            return set()
        current = self.generation_at(now)
        numbers = (self.generation_of(topic) for topic in existing)
        return {number for number in numbers if number is not None and number < current}

    def may_retire(self, generation: int, now: float) -> bool:
        """Whether no send can reach ``generation`` any more: past its end by the grace."""
        return self.rotating and now >= self.ends_at(generation) + self.grace_s

    def in_use(self, now: float, in_flight_s: float) -> list[str]:
        """The topics a producer needs the metadata of at ``now``: each generation a send
        begun before its end may still be on its way to (ended less than ``in_flight_s``
        ago), the current one, and the next once within ``lead_s``. Only these: a producer
        that goes on asking for an older one makes a broker that creates topics on request
        (Tansu does) create it again once its batchers have deleted it."""
        if not self.rotating:
            return [self.base]
        first = self.generation_at(now - in_flight_s)
        return [self.topic(number) for number in range(first, self.generation_at(now + self.lead_s) + 1)]

    def upcoming(self, now: float) -> list[str]:
        """The topics to have created by ``now``: the current generation's and, within
        ``lead_s`` of its start, the next one's."""
        return sorted({self.topic_at(now), self.topic_at(now + self.lead_s)})

"""The Redis key layout: the only place key names are spelled."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedisKeys:
    """Builds every Redis key Brimful uses, under one prefix.

    - ``{prefix}:task:{task_id}``: hash with the task's status, timestamps, outputs or error.
    - ``{prefix}:stats``: hash of counters totalled across every batcher.
    """

    prefix: str = "brimful"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

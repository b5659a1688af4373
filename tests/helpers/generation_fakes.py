"""What the generations' unit tests stand in for a generation's service: the pure
decisions of ``batcher/generations.py`` read only these of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FakeService:
    running: bool = False
    exports_gauges: bool = False
    settled: bool = False  # never retires here

    def pace_fetches(self, wait_ms: int) -> bool:
        return True


async def nothing(*_: object) -> None:
    return None

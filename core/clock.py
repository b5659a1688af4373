"""The wall clock every stored timestamp is read from."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, the unit of every stored timestamp."""
    return int(time.time() * 1000)

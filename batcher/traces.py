"""Arrival traces: recorded by live batchers, generated synthetically, replayed by the simulator.

A trace is a Parquet table with columns ``partition`` (int32) and ``arrival_s`` (float64,
seconds; wall clock when recorded, from 0 when generated). A directory of such files
reads as one trace.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([("partition", pa.int32()), ("arrival_s", pa.float64())])

Trace = dict[int, list[float]]  # partition -> sorted arrival times


class ArrivalRecorder:
    """Buffers arrivals in memory; ``flush()`` (run off the event loop) writes a file."""

    def __init__(self, directory: Path, member: str) -> None:
        self._directory = directory
        self._member = member
        self._partitions: list[int] = []
        self._arrivals: list[float] = []
        self._lock = threading.Lock()
        self._sequence = 0

    def record(self, partition: int, arrival_s: float) -> None:
        with self._lock:
            self._partitions.append(partition)
            self._arrivals.append(arrival_s)

    def flush(self) -> Path | None:
        """Write what is buffered to a new Parquet file; None when nothing was."""
        with self._lock:
            partitions, arrivals = self._partitions, self._arrivals
            self._partitions, self._arrivals = [], []
        if not arrivals:
            return None
        self._directory.mkdir(parents=True, exist_ok=True)
        self._sequence += 1
        path = self._directory / f"arrivals-{self._member}-{int(time.time())}-{self._sequence:05d}.parquet"
        table = pa.table({"partition": partitions, "arrival_s": arrivals}, schema=SCHEMA)
        temporary = path.with_suffix(".tmp")
        pq.write_table(table, temporary)
        temporary.rename(path)  # readers never see a half-written file
        return path


def write_trace(trace: Trace, path: Path) -> None:
    partitions = [p for p, times in trace.items() for _ in times]
    arrivals = [t for times in trace.values() for t in times]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"partition": partitions, "arrival_s": arrivals}, schema=SCHEMA), path)


def read_trace(path: Path) -> Trace:
    """A file, or every ``*.parquet`` in a directory, as sorted arrivals per partition."""
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no Parquet files in {path}")
    trace: Trace = {}
    for file in files:
        table = pq.read_table(file, columns=["partition", "arrival_s"])
        for partition, arrival in zip(table.column("partition").to_pylist(), table.column("arrival_s").to_pylist()):
            trace.setdefault(int(partition), []).append(float(arrival))
    for times in trace.values():
        times.sort()
    return trace


def _poisson_times(rng: random.Random, rate: float, start: float, end: float) -> Iterator[float]:
    """Arrival times of a Poisson stream at ``rate`` per second in [start, end)."""
    now = start
    while rate > 0:
        now += rng.expovariate(rate)
        if now >= end:
            return
        yield now


def poisson(rate: float, duration: float, partitions: int = 1, seed: int = 0) -> Trace:
    """Poisson arrivals at ``rate`` per second in total, spread evenly over partitions."""
    rng = random.Random(seed)
    trace: Trace = {p: [] for p in range(partitions)}
    for now in _poisson_times(rng, rate, 0.0, duration):
        trace[rng.randrange(partitions)].append(now)
    return trace


def bursty(
    rate_on: float, rate_off: float, period: float, duty: float, duration: float, partitions: int = 1, seed: int = 0
) -> Trace:
    """Alternating phases: ``rate_on`` for ``duty`` of each ``period``, ``rate_off`` the rest."""
    rng = random.Random(seed)
    trace: Trace = {p: [] for p in range(partitions)}
    cycles = math.ceil(duration / period)
    for cycle in range(cycles):
        start = cycle * period
        middle = start + duty * period
        for begin, end, rate in ((start, middle, rate_on), (middle, start + period, rate_off)):
            for now in _poisson_times(rng, rate, begin, min(end, duration)):
                trace[rng.randrange(partitions)].append(now)
    return trace


def ramp(rate_from: float, rate_to: float, duration: float, partitions: int = 1, seed: int = 0) -> Trace:
    """Arrivals whose rate moves linearly from ``rate_from`` to ``rate_to`` (thinning)."""
    rng = random.Random(seed)
    peak = max(rate_from, rate_to)
    trace: Trace = {p: [] for p in range(partitions)}
    for now in _poisson_times(rng, peak, 0.0, duration):
        rate = rate_from + (rate_to - rate_from) * now / duration
        if rng.random() < rate / peak:
            trace[rng.randrange(partitions)].append(now)
    return trace

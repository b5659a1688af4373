"""A model host started on its own, outside an embedded stack, for the tests of the host
itself (``model_server/model_host.py``)."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from brimful.model_server.reference_model import MODEL_NAME
from brimful.stack import ManagedProcess, free_port, wait_until
from brimful.stack.embedded import model_host_argv
from brimful.stack.processes import http_ok


@dataclass(frozen=True)
class ModelHost:
    """A running model host: its process, ports, and the short scratch folder that holds
    its workspace (PyTriton's socket paths must stay short)."""

    process: ManagedProcess
    grpc_port: int
    metrics_port: int
    scratch: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def start_model_host(name: str, log_path: Path, *args: str) -> ModelHost:
    """A model host with ``args`` (beside its ports and workspace), ready to answer."""
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    scratch = Path(tempfile.mkdtemp(prefix="brimful-"))
    process = ManagedProcess(
        name=name,
        argv=model_host_argv(sys.executable, (grpc_port, http_port, metrics_port), scratch / "ws", *args),
        env=dict(os.environ),
        log_path=log_path,
        stop_timeout_s=20.0,
    )
    process.start()
    try:
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{http_port}/v2/models/{MODEL_NAME}/ready"), 60, "model host", process
        )
    except BaseException:
        process.stop()
        raise
    return ModelHost(process, grpc_port, metrics_port, scratch)

"""The model host's Triton writes its own log to a file, not through PyTriton's capture of
its output (``model_server/model_host.py``): that capture reads a byte at a time into one
string copied whole on every byte, so a host whose calls fail, each logging a traceback,
slowed until its calls timed out."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from brimful.model_server.reference_model import FAIL_PREFIX, MODEL_NAME
from brimful.stack import ManagedProcess, free_port, wait_until
from brimful.stack.processes import http_ok
from brimful.workers.model_errors import ModelCallError
from brimful.workers.triton_model import TritonModel

FAILING_CALLS = 20
TRITON_FAILURE_LINE = "Failed to process the request(s)"  # Triton's own line for each failed call


async def test_a_failing_calls_log_lines_go_to_the_server_log_not_the_hosts_output(tmp_path: Path) -> None:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    scratch = Path(tempfile.mkdtemp(prefix="brimful-"))  # PyTriton's socket paths must stay short
    host_output = tmp_path / "model-host.log"
    process = ManagedProcess(
        name="model-host",
        argv=[
            sys.executable,
            "-m",
            "brimful.model_server.model_host",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
            "--workspace",
            str(scratch / "ws"),  # no --server-log: the default, beside the workspace
        ],
        env=dict(os.environ),
        log_path=host_output,
        stop_timeout_s=20.0,
    )
    process.start()
    model = TritonModel(f"127.0.0.1:{grpc_port}", MODEL_NAME, "", timeout_s=30)
    try:
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{http_port}/v2/models/{MODEL_NAME}/ready"), 60, "model host", process
        )
        signature = await model.signature()
        rows = np.array([[FAIL_PREFIX + b" row"]] + [[b"row"]] * (signature.batch_size - 1), dtype=object)
        refused = 0
        for _ in range(FAILING_CALLS):
            try:
                await model.infer({"TEXT": rows}, signature)
            except ModelCallError:
                refused += 1
        assert refused == FAILING_CALLS
    finally:
        await model.close()
        process.stop()
    server_log = (scratch / "tritonserver.log").read_text(errors="replace")
    shutil.rmtree(scratch, ignore_errors=True)
    assert server_log.count(TRITON_FAILURE_LINE) >= FAILING_CALLS
    assert TRITON_FAILURE_LINE not in host_output.read_text(errors="replace")

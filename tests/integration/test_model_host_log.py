"""The model host's Triton writes its own log to a file, not through PyTriton's capture of
its output (``model_server/model_host.py``): that capture reads a byte at a time into one
string copied whole on every byte, so a host whose calls fail, each logging a traceback,
slowed until its calls timed out."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from brimful.model_server.reference_model import FAIL_PREFIX, MODEL_NAME
from brimful.workers.model_errors import ModelCallError
from brimful.workers.triton_model import TritonModel
from tests.helpers.model_hosts import start_model_host

FAILING_CALLS = 20
TRITON_FAILURE_LINE = "Failed to process the request(s)"  # Triton's own line for each failed call


async def test_a_failing_calls_log_lines_go_to_the_server_log_not_the_hosts_output(tmp_path: Path) -> None:
    host_output = tmp_path / "model-host.log"
    host = start_model_host("model-host", host_output)  # no --server-log: the default, beside the workspace
    model = TritonModel(host.url, MODEL_NAME, "", timeout_s=30)
    try:
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
        host.process.stop()
    server_log = (host.scratch / "tritonserver.log").read_text(errors="replace")
    shutil.rmtree(host.scratch, ignore_errors=True)
    assert server_log.count(TRITON_FAILURE_LINE) >= FAILING_CALLS
    assert TRITON_FAILURE_LINE not in host_output.read_text(errors="replace")

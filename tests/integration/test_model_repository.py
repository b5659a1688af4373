"""The production model repository (deploy/triton/models) loads and serves in a real
Triton server: the same reference model, fixed at 64 rows, with the same fault hook, and
the same function fixed at 16 rows."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from brimful.stack import ManagedProcess, free_port, wait_until
from brimful.stack.processes import http_ok
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.triton_model import TritonModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repository_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    workdir = tmp_path_factory.mktemp("repository")
    env = dict(os.environ, REFERENCE_MODEL_SOURCE=str(ROOT))
    process = ManagedProcess(
        name="tritonserver",
        argv=[
            sys.executable,
            "-m",
            "brimful.model_server.repository_server",
            "--model-repository",
            str(ROOT / "deploy" / "triton" / "models"),
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
            "--server-dir",
            str(workdir / "server"),
        ],
        env=env,
        log_path=workdir / "tritonserver.log",
    )
    process.start()
    try:
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{http_port}/v2/models/brimful_reference/ready"),
            60,
            "tritonserver on the model repository",
            process,
        )
        yield f"127.0.0.1:{grpc_port}"
    finally:
        process.stop()


async def test_repository_model_serves_64_rows_and_refuses_others(repository_server: str) -> None:
    model = TritonModel(repository_server, "brimful_reference", "", timeout_s=10)
    try:
        signature = await model.signature()
        texts = np.array([[f"repo {i} ✓".encode()] for i in range(64)], dtype=object)
        outputs = await model.infer({"TEXT": texts}, signature)
        assert [v.decode() for v in outputs["SHA256"][:, 0]] == [hashlib.sha256(t).hexdigest() for t in texts[:, 0]]
        assert outputs["LENGTH"][:, 0].tolist() == [len(t) for t in texts[:, 0]]
        assert signature.batch_size == 64  # read from the repository's configuration
        # A signature that says 32 rows passes the client's own check, to reach Triton's.
        with pytest.raises(ModelCallError) as raised:
            await model.infer({"TEXT": texts[:32]}, replace(signature, batch_size=32))
        assert raised.value.error_class is ErrorClass.REJECTED
        faulty = texts.copy()
        faulty[5, 0] = b"!fail in the repository model"
        with pytest.raises(ModelCallError) as raised:
            await model.infer({"TEXT": faulty}, signature)
        assert raised.value.error_class is ErrorClass.MODEL_ERROR
        assert "!fail" in raised.value.message
    finally:
        await model.close()


async def test_repository_serves_the_same_function_fixed_at_16_rows(repository_server: str) -> None:
    model = TritonModel(repository_server, "brimful_reference_16", "", timeout_s=10)
    try:
        signature = await model.signature()
        assert signature.batch_size == 16
        texts = np.array([[f"small {i}".encode()] for i in range(16)], dtype=object)
        outputs = await model.infer({"TEXT": texts}, signature)
        assert [v.decode() for v in outputs["SHA256"][:, 0]] == [hashlib.sha256(t).hexdigest() for t in texts[:, 0]]
        wide = np.array([[b"x"]] * 64, dtype=object)
        with pytest.raises(ModelCallError) as raised:
            await model.infer({"TEXT": wide}, replace(signature, batch_size=64))
        assert raised.value.error_class is ErrorClass.REJECTED
    finally:
        await model.close()

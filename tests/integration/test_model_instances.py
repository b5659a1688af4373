"""The model host's ``--instances``: several copies of the model in one Triton server run
calls side by side (as several instances on one GPU do), measured from Triton's own side."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from brimful.model_server.reference_model import MODEL_NAME
from brimful.stack import read_sample_sums
from brimful.workers.triton_model import TritonModel
from tests.helpers.model_hosts import start_model_host

CALL_MS = 400  # long enough that a call queued behind another shows plainly in Triton's queue time


def host(instances: int, workdir: Path) -> Iterator[tuple[str, int]]:
    # A load that misses PyTriton's handshake window on a loaded machine is started again
    # by the model host itself (model_host.LOAD_STARTS).
    host = start_model_host(
        f"model-host-{instances}",
        workdir / f"model-host-{instances}.log",
        "--call-ms",
        str(CALL_MS),
        "--instances",
        str(instances),
    )
    try:
        yield host.url, host.metrics_port
    finally:
        host.process.stop()


@pytest.fixture(scope="module", params=[1, 2], ids=["one-instance", "two-instances"])
def model_host(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, str, int]]:
    instances = int(request.param)
    for url, metrics_port in host(instances, tmp_path_factory.mktemp(f"host-{instances}")):
        yield instances, url, metrics_port


def queued_us(metrics_port: int) -> float:
    """Triton's own count of microseconds calls spent queued for a free instance."""
    page = read_sample_sums(f"http://127.0.0.1:{metrics_port}/metrics", model=MODEL_NAME)
    return page["nv_inference_queue_duration_us_total"]


async def test_instances_run_calls_side_by_side(model_host: tuple[int, str, int]) -> None:
    instances, url, metrics_port = model_host
    # As many calls as instances, each on its own connection; the control (one instance)
    # sends four, so that a loaded machine delaying one call past another's end cannot
    # leave it with nothing queued (seen once with two calls).
    calls = 2 if instances > 1 else 4
    clients = [TritonModel(url, MODEL_NAME, "", timeout_s=30) for _ in range(calls)]
    try:
        # Each client reads the signature first, so every connection is open before the
        # calls start: a slow connect would otherwise let one call finish before the
        # other reaches Triton, on a loaded machine.
        signature, *_ = await asyncio.gather(*(client.signature() for client in clients))
        text = np.full((64, 1), b"row", dtype=object)
        before = queued_us(metrics_port)
        await asyncio.gather(*(client.infer({"TEXT": text}, signature) for client in clients))
        queued_ms = (queued_us(metrics_port) - before) / 1000
    finally:
        for client in clients:
            await client.close()
    if instances == 1:
        # The control: one instance makes the calls wait out each other; only arrivals each
        # more than a call's time apart could leave nothing queued.
        assert queued_ms > CALL_MS * 0.5
    else:
        assert queued_ms < CALL_MS * 0.5

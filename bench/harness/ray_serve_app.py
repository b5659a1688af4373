"""The reference model behind Ray Serve's ``@serve.batch``: the benchmark's path (e).

    .venv-ray/bin/python -m bench.harness.ray_serve_app --port 8500 [--call-ms 20]

Runs in its own virtual environment (``bench/throughput.py --with-ray`` makes it), because
Ray pins versions the project's own environment does not share. The model function is
Brimful's reference model, imported from this repository; calls run one at a time on
one thread, as on one GPU (and as Triton runs them with one model instance). Answers
``POST /`` with ``{"TEXT": "..."}`` by that row's outputs, and ``GET /calls`` with the model
calls so far (calls, rows, seconds in the model). Stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request


def _load_reference_model() -> Any:
    """The reference model's module, read from its file: Ray's environment does not have
    Brimful installed, and the module needs nothing of Brimful but itself."""
    path = Path(__file__).resolve().parents[2] / "model_server" / "reference_model.py"
    spec = importlib.util.spec_from_file_location("brimful_reference_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ReferenceModel = _load_reference_model().ReferenceModel

BATCH = 64


@serve.deployment(max_ongoing_requests=4096)
class ReferenceDeployment:
    def __init__(self, call_s: float) -> None:
        self._model = ReferenceModel(call_s=call_s)
        self._device = ThreadPoolExecutor(max_workers=1)  # one call at a time, off the event loop
        self._calls = {"calls": 0.0, "rows": 0.0, "seconds": 0.0}

    @serve.batch(max_batch_size=BATCH)
    async def infer(self, texts: list[str]) -> list[dict[str, Any]]:
        rows = np.array([text.encode() for text in texts], dtype=object).reshape(-1, 1)
        started = time.monotonic()
        outputs = await asyncio.get_running_loop().run_in_executor(self._device, self._model, rows)
        self._calls["calls"] += 1
        self._calls["rows"] += len(texts)
        self._calls["seconds"] += time.monotonic() - started
        return [
            {"SHA256": outputs["SHA256"][i, 0].decode(), "LENGTH": int(outputs["LENGTH"][i, 0])}
            for i in range(len(texts))
        ]

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/calls"):
            return dict(self._calls)
        body = await request.json()
        return await self.infer(body["TEXT"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--call-ms", type=float, default=0.0)
    args = parser.parse_args()
    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(ReferenceDeployment.bind(args.call_ms / 1000), route_prefix="/")
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host the reference model (or, opt-in, MiniLM) in a real Triton server via PyTriton.

Run as ``python -m brimful.model_server.model_host --grpc-port 8001``. The model is bound with
batching off and an explicit first dimension of ``batch_size``, so Triton itself
rejects any call that does not carry exactly that many rows. ``--embedding`` binds the
small deterministic embedding model beside it, the same way.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from brimful.model_server.library_path import library_path
from brimful.model_server.reference_model import MODEL_NAME, ReferenceModel, hang_file_at

log = logging.getLogger("brimful.model_host")

# PyTriton gives each instance of a model after the first 1 s to find the first one's
# handshake socket; on a loaded machine the first can take longer to start, and the load
# fails with one of these messages: the wait for the config timed out, or the socket was
# not (or no longer) listening when an instance connected (seen with two instances late in
# a full test run). The server is then started again, at most this many times in all.
HANDSHAKE_MISSED = ("Timeout occurred while waiting for config file", "get_config_from_handshake_server")
LOAD_STARTS = 3


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # A background process started from a non-interactive shell ignores SIGINT by
    # default; PyTriton stops cleanly on KeyboardInterrupt, so turn both into one.
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Served:
    """A model to bind: its name, its call, and its outputs as (name, dtype, row shape)."""

    name: str
    call: Callable[[NDArray[Any]], dict[str, NDArray[Any]]]
    outputs: tuple[tuple[str, Any, tuple[int, ...]], ...]


def reference(model: ReferenceModel) -> Served:
    return Served(MODEL_NAME, model, (("SHA256", bytes, (1,)), ("LENGTH", np.int64, (1,))))


def embedding() -> Served:
    from brimful.model_server.embedding_model import DIMENSIONS, embedding_infer
    from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING_NAME

    return Served(EMBEDDING_NAME, embedding_infer, (("EMBEDDING", np.float32, (DIMENSIONS,)),))


def minilm() -> Served:
    from brimful.model_server.minilm_model import DIMENSIONS, MiniLMModel
    from brimful.model_server.minilm_model import MODEL_NAME as MINILM_NAME

    return Served(MINILM_NAME, MiniLMModel(), (("EMBEDDING", np.float32, (DIMENSIONS,)),))


def dynamic_name(model_name: str) -> str:
    """The name the same model is served under behind Triton's dynamic batcher (the
    benchmarks' anchor: bench/harness/dynamic_batcher.py)."""
    return f"{model_name}_dynamic"


def fixed_name(model_name: str, rows: int) -> str:
    """The name the same model is served under fixed at ``rows`` rows a call."""
    return f"{model_name}_{rows}"


def serve(
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    batch_size: int,
    workspace: Path,
    served: Sequence[Served],
    also_fixed: Sequence[int] = (),
    gpu_metrics: bool = False,
    beside: Sequence[Served] = (),
    server_log: Path | None = None,
) -> None:
    """Start Triton with the model bound and block until interrupted. Each entry of
    ``served`` is one instance of the same model (Triton runs them side by side, as it
    would several instances on one GPU). For each of ``also_fixed``,
    also bind the same model under ``fixed_name``, fixed at that many rows (a second
    fixed-batch model: Triton refuses any other row count for each). Each of ``beside`` is
    another model bound fixed at ``batch_size``, one instance (the embedding models)."""
    os.environ["LD_LIBRARY_PATH"] = library_path(os.environ.get("LD_LIBRARY_PATH", ""))
    from pytriton.triton import Triton

    first = served[0]
    config = _triton_config(grpc_port, http_port, metrics_port, gpu_metrics, server_log)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    calls = [instance.call for instance in served]
    with Triton(config=config, workspace=str(workspace)) as triton:
        _bind_fixed(triton, first.name, calls, batch_size, first.outputs)
        for rows in also_fixed:
            _bind_fixed(triton, fixed_name(first.name, rows), calls, rows, first.outputs)
        for other in beside:
            _bind_fixed(triton, other.name, [other.call], batch_size, other.outputs)
        log.info("serving %s (%d instances) on grpc 127.0.0.1:%d", first.name, len(served), grpc_port)
        try:
            triton.serve()
        except KeyboardInterrupt:
            log.info("stopping model host")


def _triton_config(
    grpc_port: int, http_port: int, metrics_port: int, gpu_metrics: bool, server_log: Path | None
) -> Any:
    """The Triton server's configuration: loopback only, its log in a file of its own."""
    from pytriton.triton import TritonConfig

    return TritonConfig(
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
        exit_timeout_secs=2,
        # Off unless asked: on a machine without a GPU, Triton's start sometimes waits 60 s
        # for the GPU metrics library to give up (seen restarting an endpoint in a test).
        allow_gpu_metrics=gpu_metrics,
        # Triton's log goes to a file of its own. Left on its standard output, PyTriton reads
        # it a byte at a time into one string that it copies whole on every byte: a host whose
        # calls fail (each logs its traceback) slowed from 23 failing calls a second to 5
        # within 2,000 calls, and under CPU contention Triton's log writes blocked on the full
        # terminal while holding its logger, so calls timed out on an idle model.
        log_file=server_log,
    )


def _bind_fixed(
    triton: Any,
    name: str,
    calls: Sequence[Callable[[NDArray[Any]], dict[str, NDArray[Any]]]],
    rows: int,
    outputs: tuple[tuple[str, Any, tuple[int, ...]], ...],
) -> None:
    """Bind ``name`` fixed at exactly ``rows`` rows a call (batching off, so Triton refuses
    any other row count), one instance for each of ``calls``."""
    from pytriton.model_config import ModelConfig, Tensor

    def instance(
        call: Callable[[NDArray[Any]], dict[str, NDArray[Any]]],
    ) -> Callable[[list[dict[str, NDArray[Any]]]], list[dict[str, NDArray[Any]]]]:
        def infer(requests: list[dict[str, NDArray[Any]]]) -> list[dict[str, NDArray[Any]]]:
            return [call(request["TEXT"]) for request in requests]

        return infer

    triton.bind(
        model_name=name,
        infer_func=[instance(call) for call in calls],
        inputs=[Tensor(name="TEXT", dtype=bytes, shape=(rows, 1))],
        outputs=[Tensor(name=n, dtype=t, shape=(rows, *shape)) for n, t, shape in outputs],
        config=ModelConfig(batching=False),
        strict=True,
    )


def arguments() -> argparse.ArgumentParser:
    """The model host's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workspace", type=Path, default=None)
    parser.add_argument("--call-ms", type=float, default=0.0, help="every call takes at least this long (GPU-like)")
    parser.add_argument("--hang-ms", type=float, default=3000.0, help="how long a '!hang-once' row hangs its call")
    parser.add_argument("--fault-file", type=Path, default=None, help="'!flaky' rows fail while this file exists")
    parser.add_argument("--seen-log", type=Path, default=None, help="append every real row the model is given here")
    parser.add_argument(
        "--hang-file",
        default=None,
        help="every call hangs while this file exists ({grpc_port} in it: this host's gRPC port, so hosts differ)",
    )
    parser.add_argument(
        "--model",
        choices=["reference", "minilm"],
        default="reference",
        help="what to serve: the reference model (with its hooks) or MiniLM embeddings (needs the minilm extra)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="model instances run side by side (each its own copy of the model; on a GPU, several per card)",
    )
    parser.add_argument(
        "--embedding",
        action="store_true",
        help="also serve the small deterministic embedding model (brimful_embedding)",
    )
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="also serve MiniLM embeddings (brimful_minilm) beside the reference model (needs the minilm extra)",
    )
    parser.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="where Triton writes its own log (default: beside the workspace); never through PyTriton's capture",
    )
    parser.add_argument("--gpu-metrics", action="store_true", help="let Triton export GPU metrics (on a GPU machine)")
    parser.add_argument(
        "--also-fixed",
        type=int,
        action="append",
        default=[],
        metavar="ROWS",
        help="also serve the model fixed at ROWS rows a call, as <name>_<ROWS> (repeatable)",
    )
    return parser


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if args.instances < 1:
        parser.error("--instances must be at least 1")
    if any(rows < 1 for rows in args.also_fixed):
        parser.error("--also-fixed takes a row count of at least 1")
    logging.basicConfig(level=logging.INFO)
    # PyTriton creates the workspace itself and refuses one that already exists.
    workspace = args.workspace or Path(tempfile.mkdtemp(prefix="brimful-triton-")) / "workspace"
    start_server = functools.partial(
        serve,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        batch_size=args.batch_size,
        # MiniLM: a copy of the weights per instance. The reference model: one object shared
        # by every instance, so its hooks (hang once, the seen-log) stay once per server.
        served=[minilm() for _ in range(args.instances)]
        if args.model == "minilm"
        else [
            reference(
                ReferenceModel(
                    call_s=args.call_ms / 1000,
                    hang_s=args.hang_ms / 1000,
                    fault_file=args.fault_file,
                    seen_log=args.seen_log,
                    hang_file=hang_file_at(args.hang_file, args.grpc_port) if args.hang_file else None,
                )
            )
        ]
        * args.instances,
        also_fixed=sorted(set(args.also_fixed)),
        gpu_metrics=args.gpu_metrics,
        server_log=args.server_log or workspace.parent / "tritonserver.log",
        beside=[*([embedding()] if args.embedding else []), *([minilm()] if args.minilm else [])],
    )
    for start in range(1, LOAD_STARTS + 1):
        try:
            # Each start in a workspace of its own: PyTriton refuses one that exists.
            start_server(workspace=workspace if start == 1 else workspace.with_name(f"{workspace.name}-{start}"))
            return
        except InferenceServerException as error:
            if start == LOAD_STARTS or not any(missed in str(error) for missed in HANDSHAKE_MISSED):
                raise
            log.warning("a model instance missed PyTriton's handshake window; starting the server again")


if __name__ == "__main__":
    main()

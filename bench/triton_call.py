"""A model call's client CPU: tritonclient's ``infer`` against the request made from its protobuf messages.

    .venv/bin/python bench/triton_call.py [--calls 300] [--rounds 4] [--out-dir bench/results]

The batcher calls Triton once a batch, 64 rows, and the call's client side is a fixed cost
of every batch. Would making the KServe v2 request by hand, from the protobuf messages
tritonclient ships, and reading the answer's raw contents with numpy, cost less than
tritonclient's ``InferInput``, ``infer`` and ``InferResult.as_numpy``? Both ways run here
against one real Triton server (the reference model, hosted by PyTriton): the batcher's own
``TritonModel.infer`` (tritonclient), and the same call on the generated stub (``by_hand``
below, BYTES and numeric tensors as raw contents). The figure is the calling process's CPU
a call (``time.process_time``); rounds alternate which way goes first. Every round is saved
as it finishes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.saved_report import SavedReport, add_report_arguments, command_line, machine_description
from brimful.core.model_catalogue import ModelSignature, TensorSpec
from brimful.stack import EmbeddedStack, settings_on_free_ports
from brimful.workers.triton_model import TritonModel

WAYS = ("tritonclient", "by_hand")


def raw_contents(array: np.ndarray, datatype: str) -> bytes:
    """A tensor as Triton's raw contents: numbers little-endian in row-major order, BYTES
    elements each after its length (4 bytes, little-endian)."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return b"".join(len(value).to_bytes(4, "little") + value for value in array.flat)


def by_hand(
    channel: grpc.aio.Channel, signature: ModelSignature
) -> Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]:
    """A call made from tritonclient's protobuf messages on its generated stub."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def call(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        request = service_pb2.ModelInferRequest(model_name=signature.name)
        for spec in signature.inputs:
            tensor = request.inputs.add(name=spec.name, datatype=spec.datatype, shape=inputs[spec.name].shape)
            request.raw_input_contents.append(raw_contents(inputs[spec.name], tensor.datatype))
        for spec in signature.outputs:
            request.outputs.add(name=spec.name)
        response = await stub.ModelInfer(request, timeout=30)
        arrays = {}
        for output, raw in zip(response.outputs, response.raw_output_contents):
            if output.datatype == "BYTES":
                arrays[output.name] = deserialize_bytes_tensor(raw).reshape(tuple(output.shape))
            else:
                dtype = TensorSpec(output.name, output.datatype, ()).numpy_dtype
                arrays[output.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(output.shape))
        return arrays

    return call


def batch(signature: ModelSignature) -> dict[str, np.ndarray]:
    """A full batch of distinct texts for the reference model's one BYTES input."""
    spec = signature.inputs[0]
    rows = np.empty((signature.batch_size, *spec.row_shape), dtype=object)
    rows[:] = [[f"bench call {number}".encode()] for number in range(signature.batch_size)]
    return {spec.name: rows}


def callers(
    channel: grpc.aio.Channel, model: TritonModel, signature: ModelSignature, inputs: dict[str, np.ndarray]
) -> dict[str, Callable[[], Awaitable[object]]]:
    hand_call = by_hand(channel, signature)

    async def with_tritonclient() -> object:
        return await model.infer(inputs, signature)

    async def with_hand() -> object:
        return await hand_call(inputs)

    return {"tritonclient": with_tritonclient, "by_hand": with_hand}


async def cpu_us_per_call(call: Callable[[], Awaitable[object]], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) / calls * 1e6


async def run(
    url: str,
    model_name: str,
    args: argparse.Namespace,
    results: dict[str, Any],
    save: Callable[[dict[str, float]], None],
) -> None:
    model = TritonModel(url, model_name, "", timeout_s=30)
    channel = grpc.aio.insecure_channel(url)
    try:
        signature = await model.signature()
        results["rows"] = signature.batch_size
        inputs = batch(signature)
        ways = callers(channel, model, signature, inputs)
        first = {name: await call() for name, call in ways.items()}
        if str(first["tritonclient"]) != str(first["by_hand"]):
            raise RuntimeError("the two ways answered the same batch differently")
        for call in ways.values():  # connections warm, lazy imports done: not timed
            await cpu_us_per_call(call, 20)
        for index in range(args.rounds):
            order = WAYS if index % 2 == 0 else WAYS[::-1]
            figures = {name: await cpu_us_per_call(ways[name], args.calls) for name in order}
            save(figures)
            print(f"round {index + 1}: " + ", ".join(f"{k} {v:.0f} us a call" for k, v in figures.items()), flush=True)
    finally:
        await channel.close()
        await model.close()


def render(results: dict[str, Any]) -> str:
    lines = [
        "# A model call's client CPU: tritonclient's infer against the request made by hand",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. CPU of the calling process a "
        f"call of {results.get('rows', '?')} rows to the reference model on one Triton server (PyTriton).",
        "",
        "| round | tritonclient us a call | by hand us a call | by hand / tritonclient |",
        "|---|---|---|---|",
    ]
    ratios = []
    for index, round_ in enumerate(results["rounds"], 1):
        ratio = round_["by_hand"] / round_["tritonclient"]
        ratios.append(ratio)
        lines.append(f"| {index} | {round_['tritonclient']:.0f} | {round_['by_hand']:.0f} | {ratio:.2f} |")
    if ratios:
        saved = statistics.median(r["tritonclient"] - r["by_hand"] for r in results["rounds"])
        lines += ["", f"Median ratio: **{statistics.median(ratios):.2f}**; median saving {saved:.0f} us a call."]
    if "error" in results:
        lines += ["", f"The run stopped: {results['error']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per way per round")
    parser.add_argument("--rounds", type=int, default=4)
    add_report_arguments(parser, "triton_call")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "triton_call", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench/triton_call.py", args, {"calls": 300, "rounds": 4}),
        "machine": machine_description(),
        "rounds": [],
    }

    def save(figures: dict[str, float]) -> None:
        results["rounds"].append(figures)
        report.save(results)

    with tempfile.TemporaryDirectory(prefix="brimful-triton-call-") as scratch:
        stack = EmbeddedStack(settings_on_free_ports(), Path(scratch))
        try:
            stack.start_model_host()
            uvloop.run(run(stack.settings.triton_endpoints[0], stack.settings.model_name, args, results, save))
        except Exception as error:
            results["error"] = f"{type(error).__name__}: {error}"[:300]
            report.save(results)
            raise
        finally:
            stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

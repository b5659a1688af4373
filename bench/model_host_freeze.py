"""Does a model host answer a call with another call's rows? Frozen (SIGSTOP) against hung.

    .venv/bin/python bench/model_host_freeze.py [--seconds 240] [--rounds 2] [--out-dir bench/results]

The chaos soak once found a task done with another task's result. The rows Brimful sends
and the outputs it stores are paired by position, so this asks the model host itself:
callers send the reference model calls of unique rows (most with one real row, as poison
isolation sends them; some full), many at once, through Brimful's own ``TritonModel``,
each answer checked row by row against its own rows, while the host is, every few seconds,

- **frozen**: its process group stopped with SIGSTOP for 1-4 s, then SIGCONT (a paused VM
  or container, as the soak's "endpoint stopped" fault did), or
- **hung**: its model stops answering for 1-4 s (``--hang-file``), its processes running.

Rounds alternate the two on fresh hosts; a host that died is started again. Counted: calls
answered, answers with a row that is not its own (and whether it is a row another call
sent), answers garbled (``TritonModel`` refuses them as malformed), host restarts. Every
round is saved as it finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.saved_report import SavedReport, add_report_arguments, command_line, machine_description, why
from brimful.core.model_catalogue import ModelSignature
from brimful.model_server.reference_model import hang_file_at
from brimful.stack import EmbeddedStack, settings_on_free_ports
from brimful.workers.model_errors import ModelCallError
from brimful.workers.triton_model import TritonModel

MODES = ("frozen", "hung")
CALLERS = 8
HOST = "triton"
HANG_FILE = "hang-{grpc_port}"  # in the stack's workdir


class Round:
    """One round's counts, and the rows sent so far (by their digest) to name a stray row."""

    def __init__(self, mode: str) -> None:
        self.figures: dict[str, Any] = {
            "mode": mode,
            "answered": 0,
            "wrong rows": 0,
            "of them another call's row": 0,
            "garbled": 0,
            "failed or timed out": 0,
            "faults": 0,
            "host restarts": 0,
        }
        self.sent: dict[str, bytes] = {}


async def caller(
    model: TritonModel, signature: ModelSignature, number: int, round_: Round, stop: asyncio.Event
) -> None:
    rng = random.Random(number)
    figures = round_.figures
    while not stop.is_set():
        real = 1 if rng.random() < 0.7 else rng.randint(2, signature.batch_size)
        rows = [f"caller {number} {uuid.uuid4().hex}".encode() for _ in range(real)]
        digests = [hashlib.sha256(row).hexdigest() for row in rows]
        round_.sent.update(zip(digests, rows))
        batch = np.empty((signature.batch_size, 1), dtype=object)
        batch[:] = [[row] for row in rows] + [[b""]] * (signature.batch_size - real)
        try:
            outputs = await model.infer({"TEXT": batch}, signature)
        except ModelCallError as error:
            figures["garbled" if "malformed" in error.message else "failed or timed out"] += 1
            await asyncio.sleep(0.02)
            continue
        figures["answered"] += 1
        for digest, got in zip(digests, outputs["SHA256"].reshape(-1)):
            if bytes(got).decode(errors="replace") != digest:
                figures["wrong rows"] += 1
                figures["of them another call's row"] += bytes(got).decode(errors="replace") in round_.sent


async def faults(stack: EmbeddedStack, mode: str, round_: Round, stop: asyncio.Event) -> None:
    rng = random.Random(7)
    hang = hang_file_at(stack.workdir / HANG_FILE, stack.model_host_ports[HOST][0])
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(3.0, 8.0))
        if not stack.processes[HOST].running():
            round_.figures["host restarts"] += 1
            await asyncio.to_thread(stack.restart, HOST)
            continue
        round_.figures["faults"] += 1
        if mode == "frozen":
            pid = stack.processes[HOST].pid
            assert pid is not None
            os.killpg(pid, signal.SIGSTOP)
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            os.killpg(pid, signal.SIGCONT)
        else:
            hang.touch()
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            hang.unlink()


async def one_round(stack: EmbeddedStack, mode: str, seconds: float) -> dict[str, Any]:
    round_ = Round(mode)
    model = TritonModel(stack.settings.triton_endpoints[0], stack.settings.model_name, "", timeout_s=1.5)
    try:
        signature = await model.signature()
        stop = asyncio.Event()
        running = [asyncio.create_task(caller(model, signature, n, round_, stop)) for n in range(CALLERS)]
        running.append(asyncio.create_task(faults(stack, mode, round_, stop)))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*running)
    finally:
        await model.close()
    return round_.figures


def render(results: dict[str, Any]) -> str:
    keys = [
        "answered",
        "wrong rows",
        "of them another call's row",
        "garbled",
        "failed or timed out",
        "faults",
        "host restarts",
    ]
    lines = [
        "# A model host frozen (SIGSTOP) against hung: answers with another call's rows",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. The reference model on one "
        f"PyTriton host, {CALLERS} callers through `TritonModel`, {results['seconds']} s a round; a fault every 3-8 s "
        "lasting 1-4 s.",
        "",
        "| round | mode | " + " | ".join(keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for index, figures in enumerate(results["rounds"], 1):
        lines.append(f"| {index} | {figures['mode']} | " + " | ".join(str(figures[key]) for key in keys) + " |")
    for mode in MODES:
        rounds = [figures for figures in results["rounds"] if figures["mode"] == mode]
        if rounds:
            answered = sum(figures["answered"] for figures in rounds)
            wrong = sum(figures["wrong rows"] for figures in rounds)
            lines += ["", f"{mode}: {wrong} wrong rows in {answered} answers over {len(rounds)} rounds."]
    if "error" in results:
        lines += ["", f"The run stopped: {results['error']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="seconds a round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternated")
    add_report_arguments(parser, "model_host_freeze")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "model_host_freeze", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench/model_host_freeze.py", args, {"seconds": 240.0, "rounds": 2}),
        "machine": machine_description(),
        "seconds": args.seconds,
        "rounds": [],
    }
    for index in range(2 * args.rounds):
        mode = MODES[index % 2]
        with tempfile.TemporaryDirectory(prefix="brimful-freeze-") as scratch:
            workdir = Path(scratch)
            stack = EmbeddedStack(
                settings_on_free_ports(),
                workdir,
                model_host_args=("--call-ms", "20", "--hang-file", str(workdir / HANG_FILE)),
            )
            try:
                stack.start_model_host()
                started = time.monotonic()
                figures = asyncio.run(one_round(stack, mode, args.seconds))
                figures["seconds"] = round(time.monotonic() - started)
                results["rounds"].append(figures)
                report.save(results)
                print(f"round {index + 1}: {figures}", flush=True)
            except Exception as error:  # a failed round is recorded; the next one still runs
                results["error"] = f"round {index + 1}: {why(error)}"
                report.save(results)
            finally:
                stack.stop()
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

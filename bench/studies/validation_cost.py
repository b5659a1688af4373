"""What OpenAI's validation of a batch job's input costs the API worker that drives it: each
line checked at ``validating`` (the default) against only counted (``invalid_lines:
error_file``), side by side, in this process.

    .venv/bin/python -m bench.studies.validation_cost [--lines 50000] [--rounds 5]

A job's input file is read once more at ``validating`` either way (its lines counted); the
default also checks every line as it would run (``InputCheck`` in ``api/jobs/job_lines.py``:
JSON, fields, the body against the model's signature, each input encoded). Both are timed
over the same lines, for a ``/v1/tasks`` file and a ``/v1/embeddings`` file of three
inputs a line; the figure is the best of ``--rounds``, in microseconds a line, and the time
a file of ``--lines`` lines (the default ``BRIMFUL_BATCH_MAX_LINES``) holds the worker.
The reading of the file from the object store is not timed: it is the same for both.

Figures go to ``validation_cost.json`` and the report ``validation_cost.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from bench.harness.saved_report import SavedReport, add_report_arguments, command_line, machine_description
from brimful.api.jobs.job_lines import InputCheck
from brimful.api.openai.embedding_request import EMBEDDINGS_PATH
from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec

DEFAULTS = {"lines": 50_000, "rounds": 5}
TASKS_PATH = "/v1/tasks"
TEXT = (TensorSpec("TEXT", "BYTES", (1,)),)
CATALOGUE = ModelCatalogue.of(
    [
        ModelSignature("brimful_reference", "1", 64, TEXT, (TensorSpec("LENGTH", "INT64", (1,)),)),
        ModelSignature("brimful_embedding", "1", 64, TEXT, (TensorSpec("EMBEDDING", "FP32", (32,)),)),
    ]
)


def lines(endpoint: str, count: int) -> list[bytes]:
    """A job's input lines for ``endpoint``, as a client writes them."""
    made = []
    for n in range(count):
        if endpoint == EMBEDDINGS_PATH:
            body: dict[str, Any] = {"model": "brimful_embedding", "input": [f"line {n} text {k}" for k in range(3)]}
        else:
            body = {"inputs": {"TEXT": f"a sentence to run, line {n}"}}
        made.append(orjson.dumps({"custom_id": f"l{n}", "method": "POST", "url": endpoint, "body": body}))
    return made


def us_a_line(endpoint: str, sample: list[bytes], strict: bool, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        check = InputCheck(endpoint, CATALOGUE if strict else None, 2048)
        started = time.perf_counter()
        for raw in sample:
            check.add(raw)
        best = min(best, time.perf_counter() - started)
        assert check.invalid == 0
    return best / len(sample) * 1e6


def render(results: dict[str, Any]) -> str:
    rows = [
        "# What validating a batch job's every line costs the API worker",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. In process, best of "
        f"{results['rounds']} rounds over {results['lines']:,} lines; the object store's read not timed.",
        "",
        "| endpoint | counted only, us a line | checked, us a line | checked / counted | a full file checked, s |",
        "|---|---|---|---|---|",
    ]
    for endpoint, timed in results["endpoints"].items():
        counted, checked = timed["counted_us"], timed["checked_us"]
        rows.append(
            f"| {endpoint} | {counted:.2f} | {checked:.2f} | {checked / counted:.0f}x "
            f"| {checked * results['lines'] / 1e6:.2f} |"
        )
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=DEFAULTS["lines"], help="lines of each file")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"], help="rounds; the best is kept")
    add_report_arguments(parser, "validation_cost")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "validation_cost", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench.studies.validation_cost", args, DEFAULTS),
        "machine": machine_description(),
        "lines": args.lines,
        "rounds": args.rounds,
        "endpoints": {},
    }
    for endpoint in (TASKS_PATH, EMBEDDINGS_PATH):
        sample = lines(endpoint, args.lines)
        results["endpoints"][endpoint] = {
            "counted_us": us_a_line(endpoint, sample, False, args.rounds),
            "checked_us": us_a_line(endpoint, sample, True, args.rounds),
        }
        report.save(results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

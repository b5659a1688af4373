"""Should the hot route's body be checked by its JSON Schema? The hand parse of
``POST /v1/tasks`` against a schema check of the same body, side by side, in one run.

    .venv/bin/python -m bench.studies.body_checks [--rounds 5] [--bodies 20000]

Each round times, on the same bodies: the route's own parse (``parse_submission``: shape,
model, inputs encoded to tensors), a jsonschema check of the submit schema the OpenAPI
document shows (``submit_schema``), that check followed by the tensor encoding the schema
cannot do, and the same check by jsonschema-rs (compiled; schemathesis brings it). The cold routes (a batch job, a webhook endpoint) are checked by schema
(``api/http/body_schema.py``); this says what the same would cost a task on the hot one.
Saved after every round to ``bench/results/body_checks.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator

from bench.harness.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    machine_description,
    value_range,
)
from brimful.api.openapi.document import submit_schema
from brimful.api.tasks.submission import parse_submission
from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec, encode_input

REFERENCE = ModelSignature(
    "brimful_reference", "1", 64, (TensorSpec("TEXT", "BYTES", (1,)),), (TensorSpec("EMBEDDING", "FP32", (4,)),)
)


def bodies(count: int) -> list[dict[str, Any]]:
    """Bodies as clients send them: text inputs, some with a deadline or priority."""
    made: list[dict[str, Any]] = []
    for n in range(count):
        body: dict[str, Any] = {"inputs": {"TEXT": f"a sentence to embed, number {n}"}}
        if n % 3 == 0:
            body["deadline_ms"] = 2000
        if n % 5 == 0:
            body["priority"] = "low"
        made.append(body)
    return made


def us_a_body(check: Callable[[dict[str, Any]], object], sample: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    for body in sample:
        check(body)
    return (time.perf_counter() - started) / len(sample) * 1e6


def render(results: dict[str, Any]) -> str:
    """The report: each check's microseconds a body over the rounds, and its ratio to the hand parse."""
    runs = results["runs"]
    lines = [
        "# Body checks on the hot route: hand parse against JSON Schema",
        "",
        f"`{results['command']}` on {results['machine']}; {len(runs)} rounds of {results['bodies']} bodies.",
        "",
        "| check | us a body (range over rounds) | x the hand parse (median) |",
        "|---|---:|---:|",
    ]
    hand = statistics.median(run[HAND] for run in runs) if runs else 0.0
    for name in CHECKS:
        values = [run[name] for run in runs]
        if values and hand:
            lines.append(f"| {name} | {value_range(values, 2)} | {statistics.median(values) / hand:.2f}x |")
    return "\n".join(lines) + "\n"


HAND, SCHEMA, BOTH = "hand parse (the route's)", "schema check alone", "schema check + encoding"
RUST = "schema check alone, jsonschema-rs"
CHECKS = (HAND, SCHEMA, BOTH, RUST)
DEFAULTS = {"rounds": 5, "bodies": 20_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    parser.add_argument("--bodies", type=int, default=DEFAULTS["bodies"])
    add_report_arguments(parser, "body_checks")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "body_checks", render)
    if args.render:
        report.render_again()
        return
    catalogue = ModelCatalogue.of([REFERENCE])
    validator = Draft202012Validator(submit_schema(catalogue))
    sample = bodies(args.bodies)

    def by_schema_then_encoded(body: dict[str, Any]) -> object:
        validator.validate(body)
        return encode_input(REFERENCE.inputs[0], body["inputs"]["TEXT"])

    checks: dict[str, Callable[[dict[str, Any]], object]] = {
        HAND: lambda body: parse_submission(body, catalogue),
        SCHEMA: validator.validate,
        BOTH: by_schema_then_encoded,
        RUST: jsonschema_rs.validator_for(submit_schema(catalogue)).validate,
    }
    command = command_line("bench.studies.body_checks", args, DEFAULTS)
    results: dict[str, Any] = {"command": command, "machine": machine_description(), "bodies": args.bodies, "runs": []}
    for round_number in range(args.rounds):
        # Interleaved: the machine's mood in a round hits every check alike.
        report.step(results, lambda: {name: round(us_a_body(check, sample), 3) for name, check in checks.items()},
                    round=round_number + 1)  # fmt: skip
    print(report.md_path.read_text())


if __name__ == "__main__":
    main()

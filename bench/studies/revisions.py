"""What a change bought: two revisions of Brimful side by side, the API's and the batcher's CPU a task.

    .venv/bin/python -m bench.studies.revisions --base REV [--head REV] [--config 2x1x1x1] [--seconds 15] [--reps 5]

On a shared, noisy machine a figure from one day cannot be held against one from another:
this runs both revisions in the same session, alternated. Each revision is taken from git
(``git archive``; the head defaults to the working tree as it is) into a scratch folder laid
out as ``brimful.*``, and each repetition starts a stack from each folder in turn (its
processes run as ``python -m`` there, so they import that copy before the editable install;
``bench/studies/compiled_api.py`` does the same). The shape and load are ``front_door.py``'s: the
GPU-like model, the direct lane, a closed loop of 256 clients after a 3 s warm-up. Every run
is saved as it ends.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from bench.front_door import lane_rows
from bench.harness.saved_report import SavedReport, add_report_arguments, command_line, machine_description
from bench.scale import Shape
from bench.studies.compiled_api import copy_package, measure_alternated, medians

ROOT = Path(__file__).resolve().parents[2]
WORKING_TREE = "working tree"


def revision_name(rev: str) -> str:
    """``rev`` as a short commit id (the working tree keeps its name)."""
    if rev == WORKING_TREE:
        return rev
    return subprocess.run(
        ["git", "rev-parse", "--short", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def lay_out(rev: str, tree: Path) -> None:
    """Revision ``rev`` (or the working tree) in ``tree`` as the package ``brimful.*``."""
    source = ROOT
    if rev != WORKING_TREE:
        source = tree.parent / f"{tree.name}-source"
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as files:
            files.extractall(source, filter="data")
    copy_package(source, tree)


def pair_command(module: str, args: argparse.Namespace, defaults: dict[str, object]) -> tuple[str, str, str]:
    """(base, head, the command a report names) for a script taking ``--base`` and ``--head``
    (``args``) and the flags of ``defaults``."""
    base, head = revision_name(args.base), revision_name(args.head)
    rest = command_line("", args, defaults).removeprefix("python -m ")
    command = f"python -m {module} --base {base}" + (f" --head {head}" if args.head != WORKING_TREE else "") + rest
    return base, head, command


def lay_out_pair(args: argparse.Namespace, scratch: Path) -> dict[str, Path]:
    """The folders, under ``scratch``, of ``args.base`` and ``args.head`` laid out as
    ``brimful.*``, by their names as ``pair_command`` gives them."""
    trees = {}
    for role, rev in (("base", args.base), ("head", args.head)):
        trees[revision_name(rev)] = scratch / role
        lay_out(rev, scratch / role)
    return trees


def render(results: dict[str, Any]) -> str:
    lines = [
        f"# Two revisions side by side: {results['base']} and {results['head']}",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Configuration {results['config']} "
        "(WxBxPxE as in scale.md), GPU-like model, direct lane, closed loop of 256 clients after a 3 s warm-up, "
        "each revision on a stack of its own, their order swapped every other repetition. No floor is measured "
        "here (the x floor column stays empty): the two revisions are held against each other.",
        "",
        *lane_rows(results),
        "",
        *medians(results, (results["base"], results["head"])),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a git revision")
    parser.add_argument("--head", default=WORKING_TREE, help="a git revision (default: the working tree)")
    parser.add_argument("--config", default="2x1x1x1", help="WxBxPxE, as bench/scale.py takes it")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=5)
    add_report_arguments(parser, "revisions")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "revisions", render)
    if args.render:
        report.render_again()
        return 0
    shape = Shape.parse(args.config)
    base, head, command = pair_command(
        "bench.studies.revisions", args, {"config": "2x1x1x1", "seconds": 15.0, "reps": 5}
    )
    results: dict[str, Any] = {
        "command": command,
        "machine": machine_description(),
        "config": str(shape),
        "base": base,
        "head": head,
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="brimful-revisions-") as scratch:
        trees = lay_out_pair(args, Path(scratch))
        for number in range(1, args.reps + 1):
            rep: dict[str, Any] = {"rep": number, "floor": {}, "lanes": []}
            results["runs"].append(rep)
            measure_alternated(rep, [(base, trees[base]), (head, trees[head])], shape, args.seconds, report, results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

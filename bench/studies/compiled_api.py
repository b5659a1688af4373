"""Does compiling the API's hot modules with mypyc cut its CPU a task? Side by side, in one run.

    .venv/bin/python -m bench.studies.compiled_api [--config 2x1x1x1] [--seconds 10] [--reps 3]

#36 allowed compiling hot modules (mypyc or Cython) to bring the API near its floor. This
builds, with mypyc (it ships with mypy, a test extra; it needs a C compiler and Python's
headers), the modules of the task routes' path that it compiles unchanged (``COMPILED``), in
a copy of the package laid out as ``brimful.*`` in a scratch folder. Each repetition then
measures the bare floor (as ``front_door.py`` does) and, alternately, a stack that imports
the plain modules and one that imports the compiled ones: started from the copy's folder,
that stack's processes (``python -m``) find the copy before the editable install. The lane is the direct one
(the default), the shape and load ``front_door.py``'s.

Not compiled, each for what mypyc cannot take as the module stands: ``direct_lane`` (its body
reader is an async generator, which mypyc does not implement), ``task_routes`` (mypyc checks
argument types at import, and FastAPI's ``Depends(...)`` defaults are not a ``Principal``),
``http_protocol`` (a subclass of uvicorn's interpreted protocol).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.front_door import lane_rows, measure_floor_of, measure_lane
from bench.harness.saved_report import SavedReport, add_report_arguments, command_line, machine_description, why
from bench.scale import LANES, Shape

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("api", "batcher", "workers", "model_server", "core", "schemas")  # pyproject's package-dir
COMPILED = (
    "api/http/guards.py",
    "api/http/guards.py",
    "api/tasks/group_commit.py",
    "api/http/bodies.py",
    "api/tasks/submission.py",
    "api/tasks/submitter.py",
    "api/tasks/task_waiters.py",
    "core/model_catalogue.py",
)
SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(name="brimful-compiled", packages=[], ext_modules=mypycify({options!r}, separate=True, opt_level="3"))
"""


def copy_package(source: Path, tree: Path) -> None:
    """The project in ``source`` copied into ``tree`` as the package ``brimful.*``: its
    ``brimful/`` with each room (``ROOMS``, pyproject's package-dir) inside it."""
    package = tree / "brimful"
    shutil.copytree(source / "brimful", package, ignore=shutil.ignore_patterns("__pycache__"))
    for room in ROOMS:
        shutil.copytree(source / room, package / room, ignore=shutil.ignore_patterns("__pycache__"))


def build(tree: Path, log: Path) -> None:
    """The package as ``brimful.*`` in ``tree``, with ``COMPILED`` built in place beside
    their sources (an extension module is imported before a source of the same name)."""
    copy_package(ROOT, tree)
    # mypy's options as ``make check`` reads them (the pydantic plugin above all).
    options = ["--config-file", str(ROOT / "pyproject.toml"), *(f"brimful/{module}" for module in COMPILED)]
    (tree / "setup.py").write_text(SETUP.format(options=options))
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=900,
        )
    # The stack's processes must import the build, not the sources: check one module.
    probe = subprocess.run(
        [sys.executable, "-c", "import brimful.api.tasks.submitter as m; print(m.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    if not probe.stdout.strip().endswith(".so"):
        raise RuntimeError(f"the compiled copy is not what imports: {probe.stdout.strip()}")


@contextmanager
def importing_from(tree: Path | None) -> Iterator[None]:
    """Processes started inside import ``brimful`` from ``tree`` (None: the editable install).
    They run as ``python -m``, which puts the working folder first on their path."""
    before = Path.cwd()
    os.chdir(tree or ROOT)
    try:
        yield
    finally:
        os.chdir(before)


def measure_alternated(
    rep: dict[str, Any],
    variants: list[tuple[str, Path | None]],
    shape: Shape,
    seconds: float,
    report: SavedReport,
    results: dict[str, Any],
) -> None:
    """Each of ``variants`` (a name, and the folder its stack imports from: None for the
    editable install) on a stack of its own, into ``rep["lanes"]``, in order on odd
    repetitions and reversed on even ones; each lane is saved as it ends, a failed one with
    its error."""
    for name, source in variants if rep["rep"] % 2 else variants[::-1]:
        try:
            with importing_from(source):
                rep["lanes"].append({"lane": name, **measure_lane(shape, seconds, LANES["direct"])})
        except Exception as error:
            rep["lanes"].append({"lane": name, "error": why(error)})
        report.save(results)


def medians(results: dict[str, Any], variants: tuple[str, ...] = ("interpreted", "compiled")) -> list[str]:
    """A line per variant (the lanes' names): the median over the repetitions of its API CPU
    a task, of that against the same repetition's bare floor, of the batcher's CPU a task,
    and of Redis's (where the runs measured it)."""
    lines = []
    for variant in variants:
        runs = [
            (lane, rep["floor"].get("asgi/raw", {}).get("server_cpu_us_per_request"))
            for rep in results["runs"]
            for lane in rep.get("lanes", [])
            if lane.get("lane") == variant and "error" not in lane
        ]
        if not runs:
            continue
        api = statistics.median(lane["api_us_per_task"] for lane, _ in runs)
        ratios = [lane["api_us_per_task"] / bare for lane, bare in runs if bare]
        ratio = f", {statistics.median(ratios):.2f}x the floor" if ratios else ""
        batcher = statistics.median(lane["batcher_us_per_task"] for lane, _ in runs)
        redis = [lane["redis_us_per_task"] for lane, _ in runs if "redis_us_per_task" in lane]
        redis_part = f"; Redis {statistics.median(redis):.0f} us" if len(redis) == len(runs) else ""
        lines.append(
            f"- {variant}, median of {len(runs)}: API {api:.0f} us a task{ratio}; batcher {batcher:.0f} us{redis_part}."
        )
    return lines


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The API compiled with mypyc, against the same modules interpreted",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. Configuration {results['config']} "
        "(WxBxPxE as in scale.md), GPU-like model, direct lane, closed loop of 256 clients after a 3 s warm-up. "
        f"Compiled with mypyc {results.get('mypy', '?')} (opt level 3): {', '.join(results['compiled'])}. "
        "Each repetition: the bare floor as in front_door.md, then a stack importing the interpreted modules "
        "and one importing the compiled ones, their order swapped every other repetition.",
        "",
        *lane_rows(results),
        "",
        *medians(results),
    ]
    if "build_error" in results:
        lines += ["", f"The build failed: {results['build_error']}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="2x1x1x1", help="WxBxPxE, as bench/scale.py takes it")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    add_report_arguments(parser, "compiled_api")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "compiled_api", render)
    if args.render:
        report.render_again()
        return 0
    shape = Shape.parse(args.config)
    from mypy.version import __version__ as mypy_version

    results: dict[str, Any] = {
        "command": command_line("bench.studies.compiled_api", args, {"config": "2x1x1x1", "seconds": 10.0, "reps": 3}),
        "machine": machine_description(),
        "config": str(shape),
        "mypy": mypy_version,
        "compiled": ["brimful." + module.removesuffix(".py").replace("/", ".") for module in COMPILED],
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="brimful-mypyc-") as scratch:
        tree = Path(scratch) / "tree"
        try:
            build(tree, Path(scratch) / "build.log")
        except Exception as error:
            log = Path(scratch) / "build.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            results["build_error"] = why(error) + (f"; the build's last lines: {tail}" if tail else "")
            report.save(results)
            print(report.md_path.read_text())
            return 1
        for number in range(1, args.reps + 1):
            rep: dict[str, Any] = {"rep": number, "floor": {}, "lanes": []}
            results["runs"].append(rep)
            measure_floor_of(rep, shape, report, results)
            variants: list[tuple[str, Path | None]] = [("interpreted", None), ("compiled", tree)]
            measure_alternated(rep, variants, shape, args.seconds, report, results)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

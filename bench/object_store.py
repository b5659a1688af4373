"""Which library keeps the files on S3: pyarrow's filesystem layer (what
``core/object_store.py`` uses) against boto3, side by side on a local S3 server.

    .venv/bin/python bench/object_store.py [--mb 200] [--reps 3]

Each repetition, for each library in turn (the order alternates), writes an object of
``--mb`` MB from chunks of 1 MB (as an upload arrives) and reads it back in chunks, each
call in a worker thread as the API makes it, and reports MB a second each way and how much
this process's peak resident memory grew. The server is SeaweedFS (``weed mini``, from the
test extra), on loopback.

Figures go to ``object_store.json`` as soon as they are measured and ``object_store.md``
is rebuilt after each; ``--render`` rebuilds it from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3

from bench.saved_report import (
    SavedReport,
    add_report_arguments,
    command_line,
    errors_footer,
    machine_description,
    value_range,
)
from brimful.core.object_store import CHUNK_BYTES, ObjectStore
from tests.helpers.s3_server import BUCKET, running_s3

DEFAULTS = {"mb": 200, "reps": 3}
LIBRARIES = ("pyarrow", "boto3")
KEY, SECRET = "brimful", "brimful-secret"


def rss_mb() -> float:
    """This process's resident memory now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 1024 / 1024


class PeakSampler:
    """The highest resident memory seen while it runs (sampled every 10 ms in a thread)."""

    def __enter__(self) -> PeakSampler:
        self.start = self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def with_pyarrow(endpoint: str, name: str, mb: int) -> tuple[float, float]:
    host = endpoint.split("://", 1)[1]
    store = ObjectStore.from_url(f"s3://{KEY}:{SECRET}@{BUCKET}/bench?endpoint_override={host}&scheme=http")
    chunk = b"x" * CHUNK_BYTES
    started = time.perf_counter()
    async with store.writer(name) as writer:
        for _ in range(mb):
            await writer.write(chunk)
    written = time.perf_counter() - started
    started, read = time.perf_counter(), 0
    async for part in store.chunks(name):
        read += len(part)
    assert read == mb * CHUNK_BYTES
    await store.delete(name)
    return written, time.perf_counter() - started


class _Chunks:
    """A file-like source of ``mb`` MB, read as much as asked at a time."""

    def __init__(self, mb: int) -> None:
        self.left = mb * CHUNK_BYTES

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        return b"x" * size


async def with_boto3(endpoint: str, name: str, mb: int) -> tuple[float, float]:
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    key = f"bench/{name}"
    started = time.perf_counter()
    await asyncio.to_thread(s3.upload_fileobj, _Chunks(mb), BUCKET, key)
    written = time.perf_counter() - started
    started, read = time.perf_counter(), 0
    body = (await asyncio.to_thread(s3.get_object, Bucket=BUCKET, Key=key))["Body"]
    while part := await asyncio.to_thread(body.read, CHUNK_BYTES):
        read += len(part)
    assert read == mb * CHUNK_BYTES
    await asyncio.to_thread(s3.delete_object, Bucket=BUCKET, Key=key)
    return written, time.perf_counter() - started


def run_once(endpoint: str, library: str, mb: int, rep: int) -> dict[str, Any]:
    runner = with_pyarrow if library == "pyarrow" else with_boto3
    with PeakSampler() as memory:
        written, read = asyncio.run(runner(endpoint, f"object-{library}-{rep}", mb))
    return {
        "library": library,
        "write_mb_per_s": mb / written,
        "read_mb_per_s": mb / read,
        "peak_rss_growth_mb": memory.peak - memory.start,
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The file store's library on S3: pyarrow against boto3",
        "",
        f"Command: `{results['command']}`. Machine: {results['machine']}. An object of {results['mb']} MB written "
        "from 1 MB chunks and read back in 1 MB chunks, each call in a worker thread, on SeaweedFS on loopback; "
        "the libraries alternate; each cell is the range over the repetitions. Peak memory growth: the highest "
        "resident memory of this process during the run (sampled every 10 ms) above what it held at the start.",
        "",
        "| library | write MB/s | read MB/s | peak memory growth, MB | runs |",
        "|---|---|---|---|---|",
    ]
    runs = [run for run in results["runs"] if "error" not in run]
    for library in LIBRARIES:
        same = [run for run in runs if run["library"] == library]
        if same:
            lines.append(
                f"| {library} | {value_range([r['write_mb_per_s'] for r in same], 0)} "
                f"| {value_range([r['read_mb_per_s'] for r in same], 0)} "
                f"| {value_range([r['peak_rss_growth_mb'] for r in same], 1)} | {len(same)} |"
            )
    lines += errors_footer(results["runs"], lambda run: f"{run['library']}, repetition {run['rep']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=DEFAULTS["mb"], help="size of the object")
    parser.add_argument("--reps", type=int, default=DEFAULTS["reps"], help="repetitions")
    add_report_arguments(parser, "object_store")
    args = parser.parse_args()
    report = SavedReport(args.out_dir, "object_store", render)
    if args.render:
        report.render_again()
        return 0
    results: dict[str, Any] = {
        "command": command_line("bench/object_store.py", args, DEFAULTS),
        "machine": machine_description(),
        "mb": args.mb,
        "runs": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="brimful-s3-") as scratch,
        running_s3(Path(scratch), identity=(KEY, SECRET)) as endpoint,
    ):
        for rep in range(args.reps):
            for library in LIBRARIES if rep % 2 == 0 else LIBRARIES[::-1]:
                report.step(results, run_once, endpoint, library, args.mb, rep, library=library, rep=rep)
    print(report.md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

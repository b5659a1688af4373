"""Load generator for the throughput benchmark; runs in a process of its own.

    python -m bench.harness.loadgen --path brimful --url http://127.0.0.1:8080 --rate 500 --duration 10
    python -m bench.harness.loadgen --path dynamic --triton 127.0.0.1:8001 --concurrency 256 --duration 8

Paths (the same model function behind each):

- ``brimful``: ``POST /v1/tasks?wait=30``, one row per request, the result inline: completion
  is observed by Brimful's long-poll, not by polling.
- ``full``: 64 real rows per call straight to the fixed-size Triton model (the ceiling).
- ``padded``: one real row per call, padded to 64, straight to the fixed-size model (naive).
- ``dynamic``: one row per call to the same model behind Triton's dynamic batcher.
- ``ray``: ``POST`` one row to a Ray Serve app wrapping the model in ``@serve.batch``.
- ``floor``: the same ``POST`` as ``brimful`` to ``bench/harness/floor_server.py``, which answers a
  constant 202 without any I/O: what the HTTP server alone costs.

Load is open-loop Poisson (``--rate``: arrivals do not wait for answers, so a slow server
cannot slow the offered load) or closed-loop (``--concurrency`` clients, each sending its
next request when the last is answered: the saturation throughput). Latency runs from
a request's scheduled arrival, so a late send counts against the server. Only requests
arriving after ``--warmup`` count. Prints one JSON summary line.
With ``--processes N`` the load is split over N processes (the rate or the clients divided
among them, each with its own texts and seed) and their records are merged before the
summary: one Python process tops out at a few thousand requests a second.

HTTP goes through ``bench/harness/raw_http.py`` (``--client raw``, the default), a client that
costs a fraction of a general one, so the machine measures Brimful and not its client;
``--client aiohttp`` is kept to measure that difference side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import multiprocessing
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from bench.harness.raw_http import Answer, HttpPool
from brimful.workers.triton_model import pad_rows

BATCH = 64
DRAIN_S = 20.0  # how long requests still out at the end may take before they count as lost


@dataclass
class Record:
    """What happened to each request that arrived inside the measured window."""

    window: tuple[float, float]  # perf_counter times: after the warm-up, to the end of arrivals
    latencies_ms: list[float] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)  # each latency's arrival, wall clock (s)
    completed_rows_in_window: int = 0
    errors: int = 0
    lost: int = 0
    finished: int = 0  # every request answered or failed, warm-up included: the divisor for CPU per request
    first_error: str = ""

    def answered(self, began: float, rows: int) -> None:
        """A request that began (was due, or was sent) at ``began`` is answered now."""
        ended = time.perf_counter()
        self.finished += 1
        if began >= self.window[0]:
            self.latencies_ms.append((ended - began) * 1000)
            self.arrived_at.append(time.time() - (ended - began))
        if self.window[0] <= ended <= self.window[1]:
            self.completed_rows_in_window += rows

    def failed(self, began: float, error: Exception) -> None:
        self.finished += 1
        if began >= self.window[0]:
            self.errors += 1
            self.first_error = self.first_error or f"{type(error).__name__}: {error}"


Send = Callable[[int], Awaitable[int]]  # sends request i, returns the rows it completed


Stages = list[tuple[float, float, float, float]]  # per answered task: sent (perf_counter), then three spans in ms


Call = Callable[[str, str, bytes], Awaitable[Answer]]  # (method, target, JSON body) -> the answer

FOLLOW_UPS = 50  # most GETs after a 202 before a request counts as failed
# After a 429 (the API holds its most waiters for the tenant) a follow-up waits as its
# Retry-After says, as Brimful's client does; this long without one. Asking again sooner is
# a retry storm: with thousands of tasks answered 202 during a stall, each asking 20 times
# a second, the API spent its CPU on 429s and an open loop at 10,000 a second on 16 cores
# never recovered.
FOLLOW_UP_PAUSE_S = 1.0


def raw_call(pool: HttpPool) -> Call:
    async def call(method: str, target: str, body: bytes) -> Answer:
        return await pool.exchange(method, target, body)

    return call


def aiohttp_call(session: aiohttp.ClientSession, base_url: str) -> Call:
    async def call(method: str, target: str, body: bytes) -> Answer:
        headers = {"Content-Type": "application/json"} if body else {}
        async with session.request(method, base_url + target, data=body or None, headers=headers) as r:
            retry_after = r.headers.get("Retry-After", "")
            return Answer(r.status, await r.read(), float(retry_after) if retry_after.isdigit() else None)

    return call


async def follow_up(call: Call, task_id: str) -> tuple[int, bytes]:
    """What a client does after a 202 (the API already held its most waiters for the
    tenant, so it answered at once): long-poll the task, pausing after a 429 as its
    Retry-After says, a bounded number of times."""
    status, raw = 0, b""
    for _ in range(FOLLOW_UPS):
        status, raw, retry_after_s = await call("GET", f"/v1/tasks/{task_id}?wait=30", b"")
        if status == 429:
            await asyncio.sleep(FOLLOW_UP_PAUSE_S if retry_after_s is None else retry_after_s)
        elif status != 200 or json.loads(raw).get("status") != "queued":
            return status, raw
    return status, raw


def brimful_sender(
    call: Call,
    stages: Stages,
    run: bytes,
    repeat_share: float = 0.0,
    seed: int = 0,
    repeated: list[int] | None = None,
    followed: list[int] | None = None,
) -> Send:
    """POST with ?wait=30. Each answer carries the task's submitted_at_ms (the API took it)
    and updated_at_ms (its result was stored): with the client's own clock on the same
    machine they split the time into to the API, inside Brimful, and back to the client.
    Texts carry ``run``, so no run repeats another's (Brimful computes identical tasks
    once). With ``repeat_share``, that share of requests repeats an earlier text of the
    run (counted in ``repeated[0]``), and every answer's digest is checked against its own
    text."""
    rng = random.Random(seed)
    sent: list[int] = []  # the numbers whose texts were sent (a repeat picks one of them)

    async def send(i: int) -> int:
        sent_at, sent_ms = time.perf_counter(), time.time() * 1000
        if repeat_share and sent and rng.random() < repeat_share:
            number = rng.choice(sent)  # a text this run already sent
            if repeated is not None:
                repeated[0] += 1
        else:
            number = i
            sent.append(i)
        text = b"bench %s %d" % (run, number)
        status, raw, _ = await call("POST", "/v1/tasks?wait=30", b'{"inputs": {"TEXT": "%s"}}' % text)
        if status == 202:
            if followed is not None:
                followed[0] += 1
            status, raw = await follow_up(call, json.loads(raw)["task_id"])
        if status != 200:  # before parsing: a refusal says what it is even if it is not JSON
            raise RuntimeError(f"{status} {raw[:200]!r}")
        body = json.loads(raw)
        if body.get("status") != "done":
            raise RuntimeError(f"{status} {str(body)[:200]}")
        if repeat_share and body["outputs"]["SHA256"] != hashlib.sha256(text).hexdigest():
            raise RuntimeError(f"wrong result for {text!r}: {str(body)[:200]}")
        answered_ms = time.time() * 1000
        submitted, stored = body["submitted_at_ms"], body["updated_at_ms"]
        stages.append((sent_at, submitted - sent_ms, stored - submitted, answered_ms - stored))
        return 1

    return send


def expecting(call: Call, target: str, body: bytes, status: int) -> Send:
    """POST ``body`` (holding %d for the request's number) and expect ``status``: the floor
    server's constant 202, Ray Serve's 200."""

    async def send(i: int) -> int:
        answered, raw, _ = await call("POST", target, body % i)
        if answered != status:
            raise RuntimeError(f"{answered} {raw[:200]!r}")
        return 1

    return send


def triton_sender(client: object, model: str, path: str) -> Send:
    import tritonclient.grpc as grpcclient

    async def send(i: int) -> int:
        if path == "full":
            rows = np.array([f"bench {i}.{j}".encode() for j in range(BATCH)], dtype=object).reshape(BATCH, 1)
            real = BATCH
        else:
            rows = np.array([f"bench {i}".encode()], dtype=object).reshape(1, 1)
            real = 1
            if path == "padded":
                rows = pad_rows(rows, BATCH)
        text = grpcclient.InferInput("TEXT", list(rows.shape), "BYTES")
        text.set_data_from_numpy(rows)
        result = await client.infer(model, [text])  # type: ignore[attr-defined]
        first_output = result.get_response().outputs[0].name
        if result.as_numpy(first_output).shape[0] != rows.shape[0]:
            raise RuntimeError("wrong number of rows back")
        return real

    return send


async def run_open(send: Send, rate: float, duration: float, warmup: float, seed: int) -> Record:
    rng = random.Random(seed)
    start = time.perf_counter()
    record = Record(window=(start + warmup, start + duration))
    outstanding: set[asyncio.Task[None]] = set()

    async def one(i: int, arrival: float) -> None:
        try:
            record.answered(arrival, await send(i))
        except Exception as error:
            record.failed(arrival, error)

    arrival, i = start, 0
    while True:
        arrival += rng.expovariate(rate)
        if arrival - start > duration:
            break
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, arrival))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
        i += 1
    await finish(outstanding, record)
    return record


async def run_closed(send: Send, concurrency: int, duration: float, warmup: float) -> Record:
    start = time.perf_counter()
    record = Record(window=(start + warmup, start + duration))

    async def client(c: int) -> None:
        i = c
        while time.perf_counter() - start < duration:
            sent = time.perf_counter()
            try:
                record.answered(sent, await send(i))
            except Exception as error:
                record.failed(sent, error)
            i += concurrency

    tasks = {asyncio.create_task(client(c)) for c in range(concurrency)}
    # The clients send until the end of the run: their last requests then get DRAIN_S.
    await finish(tasks, record, duration + DRAIN_S)
    return record


async def finish(tasks: set[asyncio.Task[None]], record: Record, timeout_s: float = DRAIN_S) -> None:
    """Wait up to ``timeout_s`` for ``tasks``; those still out then count as lost."""
    if not tasks:
        return
    _, pending = await asyncio.wait(set(tasks), timeout=timeout_s)
    record.lost = len(pending)
    for task in pending:
        task.cancel()


def stage_summary(inside: Stages) -> dict[str, dict[str, float]]:
    if not inside:
        return {}
    spans = np.array([stage[1:] for stage in inside])
    names = ("to_api", "in_brimful", "to_client")
    return {
        "stages_p50_ms": {name: float(np.median(spans[:, k])) for k, name in enumerate(names)},
        "stages_mean_ms": {name: float(spans[:, k].mean()) for k, name in enumerate(names)},
    }


def summary(
    record: Record, args: argparse.Namespace, inside: Stages, repeated: int, followed: int
) -> dict[str, object]:
    """The JSON summary; ``inside`` holds the stages of the requests sent inside the window."""
    latencies = np.array(record.latencies_ms) if record.latencies_ms else np.array([float("nan")])
    window = args.duration - args.warmup
    return {
        "path": args.path,
        "client": args.client,
        "mode": "open" if args.rate else "closed",
        "offered_per_s": args.rate,
        "concurrency": args.concurrency,
        "processes": args.processes,
        "achieved_rows_per_s": record.completed_rows_in_window / window,
        "requests": len(record.latencies_ms),
        "errors": record.errors,
        "lost": record.lost,
        "finished": record.finished,
        "first_error": record.first_error,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p90_ms": float(np.percentile(latencies, 90)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "mean_ms": float(latencies.mean()),
        # Each span's median and mean, over the requests sent inside the window (brimful path only).
        **stage_summary(inside),
        "repeated": repeated,
        "followed_up": followed,  # answered 202 at first (waiters full), then long-polled by GET
        **({"by_second": by_second(record)} if args.timeline else {}),
    }


def by_second(record: Record) -> list[dict[str, float]]:
    """Each wall-clock second of arrivals in the window: its start (Unix s), requests, p99
    and slowest (ms), so a tail can be placed in time (a stall, a topic turning)."""
    if not record.latencies_ms:
        return []
    order = np.argsort(record.arrived_at, kind="stable")
    seconds = np.floor(np.array(record.arrived_at)[order]).astype(np.int64)
    latencies = np.array(record.latencies_ms)[order]
    starts = np.flatnonzero(np.diff(seconds, prepend=seconds[0] - 1))
    timeline = []
    for begin, end in zip(starts, [*starts[1:], seconds.size]):
        inside = latencies[begin:end]
        timeline.append(
            {
                "t": int(seconds[begin]),
                "n": int(inside.size),
                "p99_ms": float(np.percentile(inside, 99)),
                "max_ms": float(inside.max()),
            }
        )
    return timeline


@dataclass
class Shard:
    """What one load-generating process measured."""

    record: Record
    inside: Stages  # the stages of requests sent inside its window
    repeated: int
    followed: int  # requests answered 202 and followed up


async def drive(args: argparse.Namespace) -> Shard:
    closers: list[Callable[[], Awaitable[None]]] = []
    stages: Stages = []
    repeated = [0]  # requests that repeated an earlier text (brimful path, --repeat-share)
    followed = [0]  # requests answered 202 and followed up by GET (brimful path)
    if args.path in ("brimful", "ray", "floor"):
        auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key and args.path == "brimful" else {}
        if args.client == "raw":
            pool = HttpPool(args.url, headers=auth)
            closers.append(pool.close)
            call = raw_call(pool)
        else:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=4000), timeout=aiohttp.ClientTimeout(total=60), headers=auth
            )
            closers.append(session.close)
            call = aiohttp_call(session, args.url.rstrip("/"))
        if args.path == "brimful":
            run = uuid.uuid4().hex.encode()
            send = brimful_sender(call, stages, run, args.repeat_share, args.seed, repeated, followed)
        elif args.path == "ray":
            send = expecting(call, "/", b'{"TEXT": "bench %d"}', 200)
        else:  # the floor: the same POST as Brimful's, to a server answering a constant 202
            send = expecting(call, "/v1/tasks", b'{"inputs": {"TEXT": "bench %d"}}', 202)
    else:
        import tritonclient.grpc.aio as grpcaio

        client = grpcaio.InferenceServerClient(args.triton)
        closers.append(client.close)
        send = triton_sender(client, args.model, args.path)
    try:
        if args.rate:
            record = await run_open(send, args.rate, args.duration, args.warmup, args.seed)
        else:
            record = await run_closed(send, args.concurrency, args.duration, args.warmup)
    finally:
        for close in closers:
            await close()
    return Shard(record, [stage for stage in stages if stage[0] >= record.window[0]], repeated[0], followed[0])


def run_shard(args: argparse.Namespace) -> Shard:
    """One process's share of the load, on its own event loop."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(drive(args))


def shard_args(args: argparse.Namespace, k: int) -> argparse.Namespace:
    """Process ``k``'s share: the rate divided evenly, the clients as evenly as whole
    clients allow, and a seed of its own (so arrivals do not line up across processes)."""
    share = copy.copy(args)
    share.rate = args.rate / args.processes
    share.concurrency = args.concurrency // args.processes + (k < args.concurrency % args.processes)
    share.seed = args.seed + k
    return share


def merged(shards: list[Shard]) -> Shard:
    """The shards' records as one: every latency, every count."""
    record = Record(window=(0.0, 0.0))
    inside: Stages = []
    for shard in shards:
        record.latencies_ms += shard.record.latencies_ms
        record.arrived_at += shard.record.arrived_at
        record.completed_rows_in_window += shard.record.completed_rows_in_window
        record.errors += shard.record.errors
        record.lost += shard.record.lost
        record.finished += shard.record.finished
        record.first_error = record.first_error or shard.record.first_error
        inside += shard.inside
    return Shard(record, inside, sum(shard.repeated for shard in shards), sum(shard.followed for shard in shards))


def measure(args: argparse.Namespace) -> Shard:
    """Run the load in this process, or split over ``args.processes`` forked ones."""
    if args.processes == 1:
        return run_shard(args)
    # Fork: nothing runs yet in this process (no loop, no threads), and the children need
    # no re-import of this script.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=args.processes, mp_context=context) as pool:
        return merged(list(pool.map(run_shard, [shard_args(args, k) for k in range(args.processes)])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=["brimful", "full", "padded", "dynamic", "ray", "floor"], required=True)
    parser.add_argument("--client", choices=["raw", "aiohttp"], default="raw", help="the HTTP client (HTTP paths)")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="Brimful's API, or the Ray Serve route")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument("--model", default="brimful_reference")
    parser.add_argument("--api-key", default="", help="brimful: the key sent as a Bearer token (auth on)")
    parser.add_argument("--rate", type=float, default=0.0, help="open loop: Poisson arrivals per second")
    parser.add_argument("--concurrency", type=int, default=0, help="closed loop: clients")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument(
        "--repeat-share",
        type=float,
        default=0.0,
        help="brimful: this share of requests repeats an earlier text of the run (results checked)",
    )
    parser.add_argument("--processes", type=int, default=1, help="split the load over this many processes")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="add each second's requests, p99 and slowest (by arrival) to the summary",
    )
    args = parser.parse_args()
    if bool(args.rate) == bool(args.concurrency):
        parser.error("give exactly one of --rate (open loop) and --concurrency (closed loop)")
    if args.processes < 1 or (args.concurrency and args.concurrency < args.processes):
        parser.error("--processes is at least 1, and at most --concurrency")
    shard = measure(args)
    print(json.dumps(summary(shard.record, args, shard.inside, shard.repeated, shard.followed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

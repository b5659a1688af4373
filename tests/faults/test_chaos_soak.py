"""The chaos soak, in the production shape: 2 API workers, 2 batchers for each of 2 models
on 4 partitions, 2 model endpoints, auth on with 3 tenants, the broker on S3 storage and
Redis syncing its log every second (as compose runs it); with BRIMFUL_SOAK_ROTATION_S, the
requests topics rotating; with BRIMFUL_SOAK_BROKER=memory, the broker keeping its records
in memory as ``make up``'s does (and then never restarted: that would empty it); with
BRIMFUL_SOAK_BROKER=kafka, Apache Kafka as production runs it (three KRaft nodes, replication
3, ``min.insync.replicas`` 2), a node killed (leaders among them) or the active controller. Traffic mixes identical inputs,
failing rows, cancels, Idempotency-Key retries, low-priority bulk, deadlines and DLQ
replays and Arrow bulk, while a seeded schedule injects a fault every 20 s or less: an API
worker killed, batchers killed and added (rebalances), an endpoint hung (its model answers
nothing for a few seconds) or killed, Redis killed (losing its last second), paused, or at
its memory limit, the records of tasks whose batch is at the model deleted, the broker
restarted, idle sockets flooding the API, uploads trickling a byte at a time.

Webhook endpoints listen for every tenant (each receiver checks its signatures and that
every event is its own tenant's), and one tenant's other endpoints hang, answer 410 (at the
end the receiver mends: on-call enables the endpoint and recovers its dead deliveries) and
429 (a thin endpoint: its events must carry the task's id and state only).
Small batch jobs come every few seconds: run plainly, cancelled, past a window of a few
seconds, or with their input deleted mid-run; each must end, its counts agreeing with its
output and error files. At the end the store must hold nothing left behind.

A batch job (OpenAI's Batch API over ``/v1/tasks``: both models, identical inputs, failing
rows, a bad line) runs through the faults; at the end every one of its lines is answered
exactly once, in the output file with its own result or in the error file.

At quiescence a ledger checks every task that got a 202: it ended exactly once, done with
its own result, or failed with its dead letter, or cancelled as asked; no retry with an
Idempotency-Key made a second task; no done result changed; no tenant read another's
task or letter; every model slot is free and every tenant's in-flight count is back to 0.

``make test`` runs it for 150 s; ``make soak`` runs it longer (BRIMFUL_SOAK_S) and writes
its figures to bench/results/soak.md (BRIMFUL_SOAK_REPORT).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import orjson
import pyarrow as pa
import pyarrow.ipc
import pytest
from redis.asyncio import Redis
from standardwebhooks import Webhook

from brimful.api.tasks.group_commit import released_within_s
from brimful.commands.up import REFERENCE_MODELS
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import default_of
from brimful.model_server.reference_model import hang_file_at
from brimful.stack import EmbeddedStack, free_port
from brimful.stack.kafka_jars import DEFAULT_KAFKA_VERSION
from tests.helpers.pipeline import expected_outputs, read_dead_letters
from tests.helpers.polling import wait_for
from tests.helpers.slow_uploads import trickle
from tests.helpers.soak_evidence import SoakEvidence
from tests.helpers.stacks import add_second_batchers, api_workers, rows_seen_by_model, s3_broker_env, stack_settings

SOAK_S = float(os.environ.get("BRIMFUL_SOAK_S", "150"))
# 0: one requests topic a model, as with Apache Kafka. With a period, the topics rotate under
# the faults (bench/results/reliability-log.md, "Topic rotation under the soak", says what that found;
# `make up` rotates every 10 s).
ROTATION_S = float(os.environ.get("BRIMFUL_SOAK_ROTATION_S", "0"))
# "s3" (durable: the broker is restarted among the faults), "memory" (``make up``'s broker)
# or "kafka" (three Apache Kafka nodes: one killed, or the active controller, among the faults).
BROKER = os.environ.get("BRIMFUL_SOAK_BROKER", "s3")
SEED = int(os.environ.get("BRIMFUL_SOAK_SEED", "7"))
REPORT = os.environ.get("BRIMFUL_SOAK_REPORT", "")
LOAD_PER_S = 12.0
BATCH_JOB_LINES = 400
BATCH_JOB_WINDOW = 8
FAULT_GAP_S = (5.0, 14.0)  # a fault, then steady load for this long: one every 20 s or less
FAULTS = (
    "api-worker",
    "batcher-kill",
    "batcher-add",
    "endpoint-hang",
    "endpoint-kill",
    "redis-kill",
    "redis-pause",
    "broker",
    "idle-flood",
    "records-at-model",
    "redis-full",
    "upload-trickle",
)
if BROKER == "memory":
    FAULTS = tuple(fault for fault in FAULTS if fault != "broker")
elif BROKER == "kafka":
    FAULTS = (*FAULTS, "controller")
elif BROKER != "s3":
    raise ValueError(f"BRIMFUL_SOAK_BROKER is s3, memory or kafka, not {BROKER!r}")
BROKER_SHAPES = {
    "s3": "the broker on S3 storage",
    "memory": "the broker in memory, never restarted",
    "kafka": f"Apache Kafka {DEFAULT_KAFKA_VERSION} on three KRaft nodes, replication 3",
}
TENANTS = ("acme", "globex", "initech")
MODELS = REFERENCE_MODELS.split(",")
HANG_FILE = "model-hang-{grpc_port}"  # in the stack's workdir: the "endpoint-hang" fault's switch
SHARED_TEXTS = [f"shared input {n}" for n in range(12)]  # identical inputs, every tenant, both models
FINAL = ("done", "failed", "cancelled", "expired")
READERS = 32  # the ledger's reads of final answers at once
UPLOAD_MAX_S = 10.0
API_WORKERS = 2
SMALL_JOB_EVERY_S = 8.0  # a small batch job: plain, cancelled, expiring, or its input deleted
SMALL_JOB_LINES = 20

# The checks at the end read every task again: about 13 minutes after a 30-minute run.
pytestmark = pytest.mark.timeout(SOAK_S + 1800)


@pytest.fixture(scope="module")
def soak_stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[EmbeddedStack]:
    workdir = tmp_path_factory.mktemp("soak-stack")
    on_s3 = BROKER == "s3"
    on_kafka = BROKER == "kafka"
    base = stack_settings(
        auth_enabled=True,
        api_workers=API_WORKERS,
        topic_partitions=4,
        models=REFERENCE_MODELS,
        endpoint_capacity=2,
        infer_timeout_s=1.5,
        breaker_max_open_s=1.0,
        kafka_request_timeout_ms=5000,
        # Tansu on S3 answers shorter fetch waits with nothing, forever; in memory, the default.
        kafka_fetch_max_wait_ms=500 if on_s3 else default_of("kafka_fetch_max_wait_ms"),
        kafka_fetch_lagging_max_wait_ms=2500,  # at most half the request timeout
        kafka_commit_after_stored_ms=2000,  # Redis syncs its log every second
        api_max_connections=64,  # so an idle-socket flood reaches the cap
        retry_backoff_ms=50.0,
        redis_timeout_s=1.0,
        topic_rotation_s=ROTATION_S,
        topic_replication=3 if on_kafka else 1,
        batch_job_window=BATCH_JOB_WINDOW,  # the job moves a few lines a step: it runs through faults
        file_upload_max_s=UPLOAD_MAX_S,  # a trickling upload is cut within the soak
        file_sweep_interval_s=5.0,  # and what it leaves is swept before the ledger looks
        webhook_allowed_hosts="127.0.0.1",  # the soak's receivers
        webhook_retry_delays_s="0.5,1,2,4",
        webhook_timeout_s=2.0,
    )
    settings = base.model_copy(update={"triton_url": f"{base.triton_url},127.0.0.1:{free_port()}"})
    stack = EmbeddedStack(
        settings,
        workdir,
        model_host_args=(
            "--call-ms",
            "20",
            "--seen-log",
            str(workdir / "model-seen.log"),
            "--fault-file",
            str(workdir / "model-fault"),
            "--hang-file",
            str(workdir / HANG_FILE),
        ),
        redis_append_only=True,
        redis_fsync="everysec",
        broker_storage="s3://tansu/" if on_s3 else "memory://tansu/",
        broker_env=s3_broker_env(request.getfixturevalue("s3_server")) if on_s3 else {},
        kafka_version=DEFAULT_KAFKA_VERSION if on_kafka else None,
        kafka_nodes=3,
    )
    try:
        stack.start()
        add_second_batchers(stack, MODELS)
        yield stack
    finally:
        stack.stop()


@dataclass
class Task:
    tenant: str
    text: str
    model: str
    cancelled: bool = False  # its DELETE answered 200
    cancelled_at: float = 0.0
    cancel_in_doubt: bool = False  # its DELETE got no answer or a 503: Redis may have applied it
    deadline_ms: int = 0  # submitted with deadline_ms: it may end expired


@dataclass
class Ledger:
    """What the clients were told, and what they saw; checked at quiescence."""

    tasks: dict[str, Task] = field(default_factory=dict)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)  # "POST 202", "GET 503", ...
    idempotency_retries: int = 0
    duplicates: list[str] = field(default_factory=list)  # a retry with a key answered another task
    cross_reads: list[str] = field(default_factory=list)  # a tenant read another's task or letter
    cross_probes: int = 0
    seen_done: dict[str, Any] = field(default_factory=dict)  # first done answer of each task watched
    # The last final answer the watch read of each task: a result once read is kept
    # BRIMFUL_RESULT_TTL_AFTER_READ_S, so a read at the end may find it gone (404).
    seen_final: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: list[tuple[str, float]] = field(default_factory=list)  # (task id, when) a done answer changed
    redis_kills: list[float] = field(default_factory=list)
    replays: int = 0
    flaky_fixed: bool = False  # the fault behind !flaky rows is off: on-call replays their letters
    records_lost_at_model: int = 0  # records of running tasks deleted ("records-at-model")
    read_then_gone: int = 0  # tasks the watch read final, gone at the end: their retention after a read passed
    uploads_cut: collections.Counter[str] = field(default_factory=collections.Counter)  # trickles: first answer line


class Tenant:
    """One tenant's client: its key, its tasks."""

    def __init__(self, name: str, key: str, api_url: str) -> None:
        self.name = name
        self.headers = {"Authorization": f"Bearer {key}"}
        self.session = aiohttp.ClientSession(api_url, headers=self.headers, timeout=aiohttp.ClientTimeout(total=20))

    async def call(self, ledger: Ledger, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        try:
            async with self.session.request(method, path, **kwargs) as response:
                body = await response.json(content_type=None) if response.content_type == "application/json" else None
                ledger.answers[f"{method} {response.status}"] += 1
                assert response.status < 500 or response.status == 503, (method, path, response.status, body)
                return response.status, body
        except (TimeoutError, aiohttp.ClientError):
            ledger.answers[f"{method} no answer"] += 1
            return 0, None


class Traffic:
    """The clients' side of the soak: a seeded mix of what users send."""

    def __init__(self, tenants: dict[str, Tenant], ledger: Ledger, rng: random.Random) -> None:
        self.tenants = tenants
        self.ledger = ledger
        self.rng = rng
        self.sent = 0

    def _text(self, tenant: str) -> str:
        roll = self.rng.random()
        if roll < 0.30:
            return self.rng.choice(SHARED_TEXTS)
        tag = uuid.uuid4().hex[:10]
        if roll < 0.36:
            return f"!fail {tenant} {tag}"
        if roll < 0.42:
            return f"!flaky {tenant} {tag}"
        return f"{tenant} {tag} ✓"

    def _accepted(self, tenant: str, task_id: str, text: str, model: str, deadline_ms: int = 0) -> None:
        self.ledger.tasks[task_id] = Task(tenant, text, model, deadline_ms=deadline_ms)

    async def one(self) -> None:
        self.sent += 1
        tenant = self.rng.choice(TENANTS)
        client = self.tenants[tenant]
        roll = self.rng.random()
        model = MODELS[1] if self.rng.random() < 0.25 else MODELS[0]
        if roll < 0.03:  # bulk as an Arrow stream: a column a row's TEXT
            await self._arrow_bulk(tenant, client, model)
            return
        if roll < 0.06:  # low-priority bulk
            texts = [f"{tenant} bulk {uuid.uuid4().hex[:10]}" for _ in range(10)]
            status, body = await client.call(
                self.ledger,
                "POST",
                "/v1/tasks:batch",
                json={"tasks": [{"inputs": {"TEXT": text}, "model": model, "priority": "low"} for text in texts]},
            )
            if status == 200:
                for text, result in zip(texts, body["results"]):
                    if "task_id" in result:
                        self._accepted(tenant, result["task_id"], text, model)
            return
        text = self._text(tenant)
        document: dict[str, Any] = {"inputs": {"TEXT": text}, "model": model}
        if self.rng.random() < 0.1:
            document["deadline_ms"] = 3000
        if roll < 0.12:  # submitted, then cancelled at once: cancelled if it still waited
            status, body = await client.call(self.ledger, "POST", "/v1/tasks", json=document)
            if status == 202:
                self._accepted(tenant, body["task_id"], text, model, document.get("deadline_ms", 0))
                status, _ = await client.call(self.ledger, "DELETE", f"/v1/tasks/{body['task_id']}")
                if status == 200:
                    self.ledger.tasks[body["task_id"]].cancelled = True
                    self.ledger.tasks[body["task_id"]].cancelled_at = time.monotonic()
                elif status in (0, 503):  # a write Redis took after the API gave up on it
                    self.ledger.tasks[body["task_id"]].cancel_in_doubt = True
            return
        if roll < 0.30:  # with an Idempotency-Key, and retried as a client that lost the answer would
            headers = {"Idempotency-Key": f"soak-{uuid.uuid4().hex}"}
            status, first = await client.call(self.ledger, "POST", "/v1/tasks", json=document, headers=headers)
            if status != 202:
                return
            self._accepted(tenant, first["task_id"], text, model, document.get("deadline_ms", 0))
            self.ledger.idempotency_retries += 1
            status, again = await client.call(self.ledger, "POST", "/v1/tasks", json=document, headers=headers)
            if status == 200 and again["task_id"] != first["task_id"]:
                self.ledger.duplicates.append(f"{first['task_id']} then {again['task_id']}")
            elif status == 202:
                self.ledger.duplicates.append(f"{first['task_id']} then a new task {again['task_id']}")
            return
        status, body = await client.call(self.ledger, "POST", "/v1/tasks", json=document)
        if status == 202:
            self._accepted(tenant, body["task_id"], text, model, document.get("deadline_ms", 0))

    async def _arrow_bulk(self, tenant: str, client: Tenant, model: str) -> None:
        texts = [self._text(tenant) for _ in range(5)]
        sink = pa.BufferOutputStream()
        table = pa.table({"TEXT": texts})
        with pyarrow.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        status, body = await client.call(
            self.ledger,
            "POST",
            f"/v1/tasks:batch?model={model}",
            data=sink.getvalue().to_pybytes(),
            headers={"Content-Type": "application/vnd.apache.arrow.stream"},
        )
        if status == 200:
            for text, result in zip(texts, body["results"]):
                if "task_id" in result:
                    self._accepted(tenant, result["task_id"], text, model)

    async def run(self, stop: asyncio.Event) -> None:
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            task = asyncio.create_task(self.one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.rng.expovariate(LOAD_PER_S))
            except TimeoutError:
                pass
        await asyncio.gather(*pending)


async def watch(
    tenants: dict[str, Tenant], ledger: Ledger, operator: Tenant, rng: random.Random, stop: asyncio.Event
) -> None:
    """What careful clients and on-call see while it runs: done answers that must never
    change, other tenants' tasks and letters that must stay out of sight, and DLQ replays."""
    turn = 0
    while not stop.is_set():
        turn += 1
        mine = [(task_id, task) for task_id, task in list(ledger.tasks.items())]
        for task_id, task in rng.sample(mine, min(40, len(mine))):
            status, body = await tenants[task.tenant].call(ledger, "GET", f"/v1/tasks/{task_id}")
            if status == 200 and body["status"] in FINAL:
                ledger.seen_final[task_id] = body
            if status != 200 or body["status"] != "done":
                if task_id in ledger.seen_done and status == 200:
                    ledger.changed.append((task_id, time.monotonic()))
                continue
            first = ledger.seen_done.setdefault(task_id, body["outputs"])
            if body["outputs"] != first:
                ledger.changed.append((task_id, time.monotonic()))
        if mine:  # another tenant's task: the same 404 as an unknown id
            for task_id, task in rng.sample(mine, min(5, len(mine))):
                other = rng.choice([t for t in TENANTS if t != task.tenant])
                ledger.cross_probes += 1
                status, body = await tenants[other].call(ledger, "GET", f"/v1/tasks/{task_id}")
                if status == 200:
                    ledger.cross_reads.append(f"{other} read {task.tenant}'s task {task_id}")
            reader = rng.choice(TENANTS)
            status, body = await tenants[reader].call(ledger, "GET", "/v1/admin/dlq", params={"limit": "100"})
            if status == 200:
                for entry in body["entries"]:
                    owner = ledger.tasks.get(entry["task_id"])
                    if owner is not None and owner.tenant != reader:
                        ledger.cross_reads.append(f"{reader} listed {owner.tenant}'s letter {entry['id']}")
        if turn % 8 == 0 and ledger.flaky_fixed:
            # On-call replays what the fault failed, once it is fixed: the !flaky rows' letters
            # (found by their task ids), which pass now. Rows that always fail stay failed.
            flaky = [task_id for task_id, task in mine if task.text.startswith("!flaky")]
            ids = rng.sample(flaky, min(100, len(flaky)))
            if ids:
                status, body = await operator.call(ledger, "POST", "/v1/admin/dlq/replay", json={"ids": ids})
                if status == 200:
                    ledger.replays += body["replayed"]
        try:
            await asyncio.wait_for(stop.wait(), timeout=3.0)
        except TimeoutError:
            pass


class Faults:
    """The seeded schedule's faults, each with the repair a supervisor or on-call makes."""

    def __init__(self, stack: EmbeddedStack, ledger: Ledger, rng: random.Random, upload_key: str) -> None:
        self.stack = stack
        self.ledger = ledger
        self.rng = rng
        self.upload_key = upload_key  # the tenant whose uploads trickle ("upload-trickle")
        self.extra: str | None = None  # a batcher added by "batcher-add", stopped at the next one

    async def inject(self, fault: str) -> None:
        stack, rng = self.stack, self.rng
        batchers = [name for name in stack.processes if name.startswith("batcher")]
        hosts = [name for name in stack.processes if name.startswith("triton")]
        if fault == "api-worker":
            workers = api_workers(stack)
            if workers:
                os.kill(rng.choice(workers), signal.SIGKILL)  # uvicorn starts another
        elif fault == "batcher-kill":
            name = rng.choice(batchers)
            stack.processes[name].kill()
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            await asyncio.to_thread(stack.restart, name)
        elif fault == "batcher-add":
            if self.extra is not None:
                await asyncio.to_thread(stack.processes.pop(self.extra).stop)
                self.extra = None
            else:
                self.extra = (await asyncio.to_thread(stack.start_batcher, None, rng.choice(MODELS))).name
        elif fault == "endpoint-hang":
            # Its model answers nothing: calls time out, the breaker opens. Not SIGSTOP of the
            # host: a PyTriton host frozen and thawed under load can answer a call with another
            # call's rows (bench/results/reliability-log.md), which is the model server's fault, not Brimful's.
            hang = hang_file_at(stack.workdir / HANG_FILE, stack.model_host_ports[rng.choice(hosts)][0])
            hang.touch()
            await asyncio.sleep(rng.uniform(2.0, 5.0))
            hang.unlink()
        elif fault == "endpoint-kill":
            name = rng.choice(hosts)
            stack.processes[name].kill()
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            await asyncio.to_thread(stack.restart, name)
        elif fault == "redis-kill":
            self.ledger.redis_kills.append(time.monotonic())
            stack.processes["redis"].kill()  # AOF synced every second: up to its last second is lost
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            await asyncio.to_thread(stack.restart, "redis")
        elif fault == "redis-pause":
            redis = Redis.from_url(stack.settings.redis_url)
            try:
                await redis.execute_command("CLIENT", "PAUSE", int(rng.uniform(2.0, 4.0) * 1000), "ALL")
            finally:
                await redis.aclose()
        elif fault == "broker" and stack.kafka is not None:
            await self._kill_kafka_node(rng.choice(stack.kafka.members).node_id, rng)
        elif fault == "controller" and stack.kafka is not None:
            await self._kill_kafka_node(await asyncio.to_thread(stack.kafka.active_controller), rng)
        elif fault == "broker":
            stack.processes["broker"].kill()
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            await asyncio.to_thread(stack.restart, "broker")
            await asyncio.to_thread(stack.wait_for_batchers)
        elif fault == "records-at-model":
            await self._lose_records_at_the_model(hosts)
        elif fault == "redis-full":
            redis = Redis.from_url(stack.settings.redis_url)
            try:
                used = int((await redis.info("memory"))["used_memory"])
                await redis.config_set("maxmemory-policy", "noeviction")
                await redis.config_set("maxmemory", str(used + 256 * 1024))
                await asyncio.sleep(rng.uniform(2.0, 4.0))
            finally:
                await redis.config_set("maxmemory", "0")
                await redis.aclose()
        elif fault == "upload-trickle":
            stop = asyncio.Event()
            port = stack.settings.api_port
            trickles = [asyncio.create_task(trickle(port, self.upload_key, stop)) for _ in range(6)]
            await asyncio.sleep(rng.uniform(4.0, UPLOAD_MAX_S + 2))  # some are cut at their total time
            stop.set()
            for answer in await asyncio.gather(*trickles, return_exceptions=True):
                head = answer.split(b"\r\n", 1)[0].decode() if isinstance(answer, bytes) else "no answer"
                self.ledger.uploads_cut[head or "no answer"] += 1
        elif fault == "idle-flood":
            idle = []
            for _ in range(4 * stack.settings.api_max_connections):
                sock = socket.socket()
                sock.setblocking(False)
                try:
                    sock.connect_ex(("127.0.0.1", stack.settings.api_port))
                except OSError:
                    pass
                idle.append(sock)
            await asyncio.sleep(rng.uniform(3.0, 6.0))
            for sock in idle:
                sock.close()

    async def _kill_kafka_node(self, node_id: int, rng: random.Random) -> None:
        """One Kafka node killed, and started again a moment later: its partitions' leaders
        move to the other two, and their replicas catch up once it is back."""
        kafka = self.stack.kafka
        assert kafka is not None
        kafka.kill_node(node_id)
        await asyncio.sleep(rng.uniform(0.5, 4.0))
        await asyncio.to_thread(kafka.start_node, node_id)
        await asyncio.to_thread(kafka.wait_ready)

    async def _lose_records_at_the_model(self, hosts: list[str]) -> None:
        """Every endpoint hangs a moment, so batches wait at the model; the records of the
        tasks running then are deleted, as a Redis restarted without its data would lose
        them; the endpoints answer again."""
        stack = self.stack
        hangs = [hang_file_at(stack.workdir / HANG_FILE, stack.model_host_ports[host][0]) for host in hosts]
        redis = Redis.from_url(stack.settings.redis_url)
        keys = RedisKeys(stack.settings.key_prefix)
        try:
            for hang in hangs:
                hang.touch()
            await asyncio.sleep(1.0)
            recent = list(self.ledger.tasks)[-600:]
            async with redis.pipeline(transaction=False) as pipe:
                for task_id in recent:
                    pipe.hget(keys.task(task_id), "status")
                statuses = await pipe.execute()
            running = [task_id for task_id, status in zip(recent, statuses) if status == b"running"][:40]
            if running:
                self.ledger.records_lost_at_model += await redis.delete(*(keys.task(t) for t in running))
        finally:
            for hang in hangs:
                hang.unlink(missing_ok=True)
            await redis.aclose()

    async def heal(self) -> None:
        """Quiescence: every process of the shape running, the extra batcher gone."""
        if self.extra is not None:
            await asyncio.to_thread(self.stack.processes.pop(self.extra).stop)
            self.extra = None
        for name, process in list(self.stack.processes.items()):
            if not process.running():
                await asyncio.to_thread(self.stack.restart, name)
        await asyncio.to_thread(self.stack.wait_for_batchers)


@pytest.fixture
async def tenants(soak_stack: EmbeddedStack) -> AsyncIterator[tuple[dict[str, Tenant], Tenant]]:
    redis = Redis.from_url(soak_stack.settings.redis_url)
    issuer = ApiKeys(redis, RedisKeys(soak_stack.settings.key_prefix))
    made = {name: (await issuer.create(name, [Scope.SUBMIT, Scope.READ, Scope.ADMIN]))[0] for name in TENANTS}
    operator_key = (await issuer.create("ops", [Scope.ADMIN, Scope.OPERATOR, Scope.READ]))[0]
    await redis.aclose()
    clients = {name: Tenant(name, key, soak_stack.api_url) for name, key in made.items()}
    operator = Tenant("ops", operator_key, soak_stack.api_url)
    yield clients, operator
    for client in [*clients.values(), operator]:
        await client.session.close()


async def test_every_accepted_task_ends_right_in_the_production_shape_under_chaos(
    soak_stack: EmbeddedStack, tenants: tuple[dict[str, Tenant], Tenant]
) -> None:
    clients, operator = tenants
    stack = soak_stack
    rng = random.Random(SEED)
    ledger = Ledger()
    traffic = Traffic(clients, ledger, random.Random(SEED + 1))
    faults = Faults(stack, ledger, random.Random(SEED + 2), clients[TENANTS[2]].headers["Authorization"].split()[1])
    fault_file = stack.workdir / "model-fault"
    fault_file.touch()  # !flaky rows fail for the first half, and pass when replayed after
    receivers = Receivers()
    await receivers.start()
    await receivers.register(clients, ledger)
    job = await BatchJob.start(clients[TENANTS[0]], ledger)
    small_jobs = SmallJobs(clients[TENANTS[1]], ledger)
    stop, checked = asyncio.Event(), asyncio.Event()
    minutes = Path(REPORT).with_suffix(".minutes.md") if REPORT else stack.workdir / "soak.minutes.md"
    evidence = asyncio.create_task(SoakEvidence(stack, MODELS, minutes).run(checked))  # through the checks too
    running = [
        asyncio.create_task(traffic.run(stop)),
        asyncio.create_task(watch(clients, ledger, operator, rng, stop)),
        asyncio.create_task(small_jobs.run(stop)),
    ]
    schedule: list[tuple[float, str]] = []
    started = time.monotonic()
    cycle: list[str] = []
    while time.monotonic() - started < SOAK_S:
        if not cycle:
            cycle = list(FAULTS)
            rng.shuffle(cycle)  # every kind of fault in each cycle, in a seeded order
        await asyncio.sleep(rng.uniform(*FAULT_GAP_S))
        if time.monotonic() - started > SOAK_S / 2 and fault_file.exists():
            fault_file.unlink()
            ledger.flaky_fixed = True
        fault = cycle.pop()
        schedule.append((round(time.monotonic() - started, 1), fault))
        await faults.inject(fault)
    stop.set()
    phase("load stopped")
    await asyncio.gather(*running)
    elapsed = time.monotonic() - started
    fault_file.unlink(missing_ok=True)
    phase("clients done; healing")
    await faults.heal()
    phase("healed; replaying letters")
    # On-call's last replay, once everything is back: every !flaky row's letter (they pass
    # now), and a few rows that always fail (they fail again, each with a new letter). Not
    # every letter at once: a thousand rows that always fail, isolated together, kept two
    # cores' model hosts past their call timeout for longer than the ledger waits.
    flaky = [task_id for task_id, task in ledger.tasks.items() if task.text.startswith("!flaky")]
    failing = [task_id for task_id, task in ledger.tasks.items() if task.text.startswith("!fail")][:20]
    chosen = flaky + failing
    for start in range(0, len(chosen), 500):
        status, body = await operator.call(
            ledger, "POST", "/v1/admin/dlq/replay", json={"ids": chosen[start : start + 500]}
        )
        if status == 200:
            ledger.replays += body["replayed"]

    phase("checking the batch job")
    job_figures, job_problems = await job.check(clients[TENANTS[0]], ledger)
    phase("checking the small jobs")
    small_figures, small_problems = await small_jobs.check()
    phase("checking the ledger")
    figures, problems = await check_ledger(stack, clients, operator, ledger)
    phase("ledger checked")
    checked.set()
    await evidence
    hook_figures, hook_problems = receivers.check(ledger)
    hook_problems += await receivers.gone_is_disabled(clients[TENANTS[0]], ledger)
    hook_problems += await receivers.gone_recovers(clients[TENANTS[0]], ledger)
    if receivers.thin_fields - {"task_id", "model", "status", "submitted_at_ms", "updated_at_ms"}:
        hook_problems.append(f"the thin endpoint's events carried {sorted(receivers.thin_fields)}")
    if not receivers.thin_fields:
        hook_problems.append("the thin endpoint got no event through its 429s")
    await receivers.stop()
    left_behind = await storage_left_behind(stack)
    figures.update({**job_figures, **small_figures, **hook_figures})
    figures["records deleted while their batch was at the model"] = ledger.records_lost_at_model
    figures["trickling uploads: answers"] = dict(ledger.uploads_cut)
    figures["objects left behind in the store"] = len(left_behind)
    figures["final answers read, then gone once their retention after a read passed"] = ledger.read_then_gone
    problems += job_problems + small_problems + hook_problems + left_behind
    deleted = generations_deleted(stack)
    figures = {
        "seconds": round(elapsed),
        "seed": SEED,
        "faults": len(schedule),
        **figures,
        "topic generations deleted": deleted,
    }
    print("\nchaos soak:", figures)
    if REPORT:
        write_report(Path(REPORT), figures, schedule)
    assert {fault for _, fault in schedule} == set(FAULTS), f"the soak was too short for every fault: {schedule}"
    if problems:
        print_evidence(stack, problems)
    assert not problems, problems[:10]
    if ROTATION_S:  # the rotation ran under the faults: finished generations were retired
        assert deleted > 0


@dataclass
class BatchJob:
    """A batch job of the soak: its lines by custom_id (text, or None for the bad line)."""

    batch_id: str
    lines: dict[str, str | None]

    @classmethod
    async def start(cls, tenant: Tenant, ledger: Ledger) -> BatchJob:
        lines: dict[str, str | None] = {}
        body = b""
        for n in range(BATCH_JOB_LINES):
            text = f"!fail job {n}" if n % 97 == 5 else f"job text {n % 23}"  # identical inputs, failing rows
            model = MODELS[n % 2]
            lines[f"job-{n}"] = text
            line = {"custom_id": f"job-{n}", "method": "POST", "url": "/v1/tasks"}
            body += orjson.dumps({**line, "body": {"inputs": {"TEXT": text}, "model": model}}) + b"\n"
        lines["bad"] = None
        body += b'{"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", body, filename="soak.jsonl")
        status, uploaded = await tenant.call(ledger, "POST", "/v1/files", data=form)
        assert status == 200, uploaded
        status, batch = await tenant.call(
            ledger,
            "POST",
            "/v1/batches",
            json={
                "input_file_id": uploaded["id"],
                "endpoint": "/v1/tasks",
                "completion_window": "24h",
                "invalid_lines": "error_file",  # its bad line answered in the error file, the rest run
            },
        )
        assert status == 200, batch
        return cls(batch["id"], lines)

    async def check(self, tenant: Tenant, ledger: Ledger) -> tuple[dict[str, object], list[str]]:
        """Once it ended: each line answered once, right, in one of its files."""
        batch: dict[str, Any] = {}

        async def ended() -> bool:
            status, answer = await tenant.call(ledger, "GET", f"/v1/batches/{self.batch_id}")
            if status == 200:
                batch.update(answer)
            return batch.get("status") in ("completed", "failed", "expired", "cancelled")

        await wait_for(ended, 300, "the batch job to end", interval_s=1.0)
        problems = [] if batch["status"] == "completed" else [f"batch job ended {batch['status']}: {batch}"]
        output = await self._file(tenant, ledger, batch.get("output_file_id"), problems)
        errors = await self._file(tenant, ledger, batch.get("error_file_id"), problems)
        for custom_id in set(output) & set(errors):
            problems.append(f"batch line {custom_id} is in both files")
        for custom_id, text in self.lines.items():
            if custom_id in output:
                outputs = output[custom_id]["response"]["body"].get("outputs")
                if text is None or text.startswith("!fail") or outputs != expected_outputs(text):
                    problems.append(f"batch line {custom_id} has a wrong result")
            elif custom_id not in errors:
                problems.append(f"batch line {custom_id} is answered in neither file")
            elif text is not None and not text.startswith("!fail"):
                problems.append(f"batch line {custom_id} failed: {errors[custom_id]}")
        counts = batch.get("request_counts", {})
        figures = {
            "batch job lines: output / error file": f"{len(output)} / {len(errors)} of {len(self.lines)}",
            "batch job status": f"{batch.get('status')} ({counts})",
        }
        return figures, problems

    async def _file(
        self, tenant: Tenant, ledger: Ledger, file_id: str | None, problems: list[str]
    ) -> dict[str, dict[str, Any]]:
        if not file_id:
            return {}
        async with tenant.session.get(f"/v1/files/{file_id}/content") as response:
            content = await response.read() if response.status == 200 else b""
        by_id: dict[str, dict[str, Any]] = {}
        for raw in content.splitlines():
            line = orjson.loads(raw)
            if line["custom_id"] in by_id:
                problems.append(f"batch line {line['custom_id']} is answered twice")
            by_id[line["custom_id"]] = line
        return by_id


JOB_KINDS = ("plain", "cancelled", "expiring", "input deleted")


@dataclass
class SmallJob:
    batch_id: str
    kind: str
    lines: dict[str, str]  # custom_id -> text
    retry_of: str = ""  # a retry: the job whose failed lines it runs again


class SmallJobs:
    """Small batch jobs made through the soak, one every ``SMALL_JOB_EVERY_S``, each of a
    kind in turn: run plainly, cancelled a moment in, given a window of a few seconds, or
    its input file deleted a moment in; and, each time a plain one is made, the plain one
    before it retried (its failed lines run again as a new job), through the faults. At the
    end each has ended, its counts agree with its output and error files, and a retry ran
    exactly the lines its first job's error file names."""

    def __init__(self, tenant: Tenant, ledger: Ledger) -> None:
        self.tenant = tenant
        self.ledger = ledger
        self.jobs: list[SmallJob] = []

    async def run(self, stop: asyncio.Event) -> None:
        turn = 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=SMALL_JOB_EVERY_S)
            except TimeoutError:
                await self._one(JOB_KINDS[turn % len(JOB_KINDS)], turn)
                turn += 1

    async def _one(self, kind: str, turn: int) -> None:
        lines = {
            f"s{turn}-{n}": (f"!fail small {turn} {n}" if n == 3 else f"small job {n % 7}")
            for n in range(SMALL_JOB_LINES)
        }
        body = b"".join(
            orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": text}}})
            + b"\n"
            for cid, text in lines.items()
        )
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", body, filename=f"small-{turn}.jsonl")
        expiring: dict[str, object] = {}
        if turn % 2:  # every other job's input and results expire (in an hour: after the soak)
            form.add_field("expires_after[anchor]", "created_at")
            form.add_field("expires_after[seconds]", "3600")
            expiring = {"output_expires_after": {"anchor": "created_at", "seconds": 3600}}
        status, uploaded = await self.tenant.call(self.ledger, "POST", "/v1/files", data=form)
        if status != 200:
            return  # refused for now (a fault): the next turn makes another
        window = "4s" if kind == "expiring" else "24h"
        status, batch = await self.tenant.call(
            self.ledger,
            "POST",
            "/v1/batches",
            json={"input_file_id": uploaded["id"], "endpoint": "/v1/tasks", "completion_window": window, **expiring},
        )
        if status != 200:
            return
        plain_before = next((job for job in reversed(self.jobs) if job.kind == "plain"), None)
        self.jobs.append(SmallJob(batch["id"], kind, lines))
        if kind == "plain" and plain_before is not None:
            await self._retry(plain_before)
        await asyncio.sleep(1.0)
        if kind == "cancelled":
            await self.tenant.call(self.ledger, "POST", f"/v1/batches/{batch['id']}/cancel")
        elif kind == "input deleted":
            await self.tenant.call(self.ledger, "DELETE", f"/v1/files/{uploaded['id']}")

    async def _retry(self, first: SmallJob) -> None:
        """Its failed lines again, as a new job (refused for now, or not ended yet: skipped)."""
        key = {"Idempotency-Key": f"soak-retry-{first.batch_id}"}
        status, batch = await self.tenant.call(self.ledger, "POST", f"/v1/batches/{first.batch_id}/retry", headers=key)
        if status == 200:
            self.jobs.append(SmallJob(batch["id"], "retry", first.lines, retry_of=first.batch_id))

    async def check(self) -> tuple[dict[str, object], list[str]]:
        problems: list[str] = []
        ends: collections.Counter[str] = collections.Counter()
        for job in self.jobs:
            batch: dict[str, Any] = {}

            async def ended(job: SmallJob = job, batch: dict[str, Any] = batch) -> bool:
                status, answer = await self.tenant.call(self.ledger, "GET", f"/v1/batches/{job.batch_id}")
                if status == 200:
                    batch.update(answer)
                return batch.get("status") in ("completed", "failed", "expired", "cancelled")

            try:
                await wait_for(ended, 120, f"small job {job.batch_id} to end", interval_s=1.0)
            except AssertionError:
                problems.append(f"small job {job.batch_id} ({job.kind}) never ended: {batch.get('status')}")
                continue
            ends[f"{job.kind}: {batch['status']}"] += 1
            problems += await self._agree(job, batch)
        return {"small batch jobs (kind: end)": dict(sorted(ends.items()))}, problems

    async def _agree(self, job: SmallJob, batch: dict[str, Any]) -> list[str]:
        """Its counts against its files: every output line right, each line once, the
        completed count the output's lines, every line counted."""
        allowed = {"plain": ("completed",), "cancelled": ("cancelled", "completed"), "retry": ("completed",),
                   "expiring": ("expired", "completed"), "input deleted": ("failed", "completed")}[job.kind]  # fmt: skip
        problems = (
            [] if batch["status"] in allowed else [f"small job {job.batch_id} ({job.kind}) ended {batch['status']}"]
        )
        counts = batch["request_counts"]
        output = await _lines(self.tenant, batch.get("output_file_id"))
        async with self.tenant.session.get(f"/v1/batches/{job.batch_id}/results") as response:
            streamed = [orjson.loads(raw) for raw in (await response.read()).splitlines() if raw.strip()]
        if response.status != 200 or sorted(map(str, streamed)) != sorted(map(str, output)):
            problems.append(f"small job {job.batch_id}: its results route ({response.status}) is not its output file")
        errors = await _lines(self.tenant, batch.get("error_file_id"))
        named = [line["custom_id"] for line in output + errors]
        if len(named) != len(set(named)):
            problems.append(f"small job {job.batch_id}: a line answered twice")
        for line in output:
            text = job.lines.get(line["custom_id"], "")
            if text.startswith("!fail") or line["response"]["body"].get("outputs") != expected_outputs(text):
                problems.append(f"small job {job.batch_id}: a wrong result for {line['custom_id']}")
        if counts["completed"] != len(output) or counts["completed"] + counts["failed"] != counts["total"]:
            problems.append(f"small job {job.batch_id}: counts {counts} against {len(output)} / {len(errors)} lines")
        if job.kind not in ("input deleted", "retry") and len(named) != SMALL_JOB_LINES:
            problems.append(f"small job {job.batch_id}: {len(named)} of {SMALL_JOB_LINES} lines in its files")
        if job.kind == "retry":
            problems += await self._retried(job, sorted(named))
        return problems

    async def _retried(self, job: SmallJob, named: list[str]) -> list[str]:
        """A retry ran exactly the lines its first job's error file names."""
        status, first = await self.tenant.call(self.ledger, "GET", f"/v1/batches/{job.retry_of}")
        failed = sorted(line["custom_id"] for line in await _lines(self.tenant, first.get("error_file_id")))
        if status != 200 or named != failed:
            return [f"retry {job.batch_id} of {job.retry_of} answered {named}, its first job failed {failed}"]
        return []


async def _lines(tenant: Tenant, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    async with tenant.session.get(f"/v1/files/{file_id}/content") as response:
        content = await response.read() if response.status == 200 else b""
    return [orjson.loads(raw) for raw in content.splitlines() if raw.strip()]


class Receivers:
    """Webhook receivers on loopback: each tenant's own, which answers at once and checks the
    signature with its secret; and one tenant's others, which hang, answer 410 (gone) and
    429 (with Retry-After). Every event a tenant's receiver gets must be about its tasks."""

    def __init__(self) -> None:
        self.port = free_port()
        self.secrets: dict[str, str] = {}  # tenant -> its /ok endpoint's secret
        self.got: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)  # tenant -> events
        self.calls: collections.Counter[str] = collections.Counter()  # path -> calls
        self.unverified = 0
        self.gone_recovered = False  # the 410 receiver answers 204 again (after the faults)
        self.thin_fields: set[str] = set()  # every field the thin endpoint's events carried
        self._release = asyncio.Event()
        self._runner: aiohttp.web.AppRunner | None = None

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.router.add_post("/{path:.*}", self._handle)
        self._runner = aiohttp.web.AppRunner(app)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        path = request.match_info["path"]
        body = await request.read()
        self.calls[path.split("/")[0]] += 1
        if path == "hang":
            try:
                await asyncio.wait_for(self._release.wait(), 30)
            except TimeoutError:
                pass
            return aiohttp.web.Response(status=204)
        if path == "gone":
            return aiohttp.web.Response(status=204 if self.gone_recovered else 410)
        if path == "busy":
            if self.calls["busy"] % 2:  # every other call: its thin event then comes through
                return aiohttp.web.Response(status=429, headers={"Retry-After": "1"})
            self.thin_fields.update(orjson.loads(body)["data"])
            return aiohttp.web.Response(status=204)
        tenant = path.split("/", 1)[1]
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            event = Webhook(self.secrets[tenant]).verify(body, headers)
        except Exception:
            self.unverified += 1
            return aiohttp.web.Response(status=400)
        self.got[tenant].append(event)
        return aiohttp.web.Response(status=204)

    async def register(self, tenants: dict[str, Tenant], ledger: Ledger) -> None:
        for name, client in tenants.items():
            url = f"http://127.0.0.1:{self.port}/ok/{name}"
            status, made = await client.call(
                ledger, "POST", "/v1/webhooks/endpoints", json={"url": url, "events": ["task.completed", "task.failed"]}
            )
            assert status == 200, made
            # Its secret rotated at once: every delivery of the soak carries two signatures,
            # and the receiver, holding only the old secret, must still verify each one.
            status, rotated = await client.call(ledger, "POST", f"/v1/webhooks/endpoints/{made['id']}/rotate-secret")
            assert status == 200 and rotated["secret"] != made["secret"], rotated
            self.secrets[name] = made["secret"]
        first = tenants[TENANTS[0]]
        for path in ("hang", "gone", "busy"):
            url = f"http://127.0.0.1:{self.port}/{path}"
            body = {"url": url, "events": ["task.completed"], "payload": "thin" if path == "busy" else "full"}
            status, made = await first.call(ledger, "POST", "/v1/webhooks/endpoints", json=body)
            assert status == 200, made

    async def gone_is_disabled(self, first: Tenant, ledger: Ledger) -> list[str]:
        """The endpoint whose receiver answers 410 is disabled, and was called no more than
        the attempts under way when it first answered (4 an endpoint, in each API worker)."""
        status, listed = await first.call(ledger, "GET", "/v1/webhooks/endpoints")
        if status != 200:
            return [f"the webhook endpoints could not be listed: {status} {listed}"]
        gone = [e for e in listed["data"] if e["url"].endswith("/gone")]
        problems = [] if gone and gone[0]["disabled"] else [f"the 410 endpoint is not disabled: {gone}"]
        if self.calls["gone"] > 4 * API_WORKERS:
            problems.append(f"the 410 endpoint was called {self.calls['gone']} times after answering 410")
        return problems

    async def gone_recovers(self, first: Tenant, ledger: Ledger) -> list[str]:
        """On-call's way back for the disabled endpoint, after the soak (its early dead
        deliveries are long trimmed from the tenant's log by then): enabled while its
        receiver still answers 410, one more task's event disables it again; then the
        receiver mends, the endpoint is enabled, and that dead delivery is recovered and
        delivered."""

        async def gone_endpoint() -> dict[str, Any]:
            _, listed = await first.call(ledger, "GET", "/v1/webhooks/endpoints")
            return next(e for e in listed["data"] if e["url"].endswith("/gone"))

        endpoint_id = (await gone_endpoint())["id"]
        enable = f"/v1/webhooks/endpoints/{endpoint_id}/enable"
        status, enabled = await first.call(ledger, "POST", enable)
        if status != 200 or enabled["disabled"]:
            return [f"the disabled endpoint could not be enabled: {status} {enabled}"]
        since = int(time.time()) - 1
        status, task = await first.call(ledger, "POST", "/v1/tasks", json={"inputs": {"TEXT": "after the soak"}})
        assert status == 202, task

        async def disabled_again() -> bool:
            return bool((await gone_endpoint())["disabled"])

        await wait_for(disabled_again, 60, "the 410 endpoint disabled again")
        self.gone_recovered, calls_before = True, self.calls["gone"]
        await first.call(ledger, "POST", enable)
        recover = f"/v1/webhooks/endpoints/{endpoint_id}/recover"
        status, recovered = await first.call(ledger, "POST", recover, json={"since": since})
        if status != 200 or not recovered["data"]:
            return [f"nothing recovered for the endpoint that answered 410: {status} {recovered}"]
        wanted = calls_before + len(recovered["data"])
        await wait_for(lambda: self.calls["gone"] >= wanted, 60, "every recovered delivery")
        return []

    def check(self, ledger: Ledger) -> tuple[dict[str, object], list[str]]:
        problems = [f"{self.unverified} webhook deliveries failed their signature check"] if self.unverified else []
        for tenant, events in self.got.items():
            for event in events:
                task = ledger.tasks.get(event["data"].get("task_id", ""))
                if task is not None and task.tenant != tenant:
                    problems.append(f"{tenant}'s receiver got {task.tenant}'s task {event['data']['task_id']}")
        delivered = {tenant: len(events) for tenant, events in sorted(self.got.items())}
        return {
            "webhook deliveries received (own receivers)": delivered,
            "webhook calls by path": dict(self.calls),
        }, problems


async def storage_left_behind(stack: EmbeddedStack) -> list[str]:
    """Once the sweep has had its time: objects that nothing points to (an upload never
    finished, a file without a record, parts of an ended job)."""
    folder = Path(stack.settings.file_store_url)
    redis = Redis.from_url(stack.settings.redis_url)
    keys = RedisKeys(stack.settings.key_prefix)
    left: list[str] = []

    async def clean() -> bool:
        left.clear()
        for path in await asyncio.to_thread(lambda: sorted(folder.iterdir())):
            name = path.name
            if ".writing-" in name:
                left.append(f"an upload never finished: {name}")
            elif name.startswith("file-") and not await redis.exists(keys.file(name)):
                left.append(f"a file without a record: {name}")
            elif name.startswith("batch_"):
                status = await redis.hget(keys.batch(name.split(".", 1)[0]), "status")
                if status is None or status.decode() in ("completed", "failed", "expired", "cancelled"):
                    left.append(f"a part of an ended job: {name}")
        return not left

    try:
        await wait_for(clean, 2 * UPLOAD_MAX_S + 30, "the store to hold nothing left behind", interval_s=2.0)
    except AssertionError:
        pass  # reported
    finally:
        await redis.aclose()
    return left


def print_evidence(stack: EmbeddedStack, problems: list[str]) -> None:
    """What the stack's logs say of the first problems' tasks, so that a failure seen once
    (in CI, say) can be followed up."""
    task_ids = [word for problem in problems[:5] for word in problem.replace(",", " ").split() if len(word) == 32]
    lines: dict[str, list[str]] = {task_id: [] for task_id in dict.fromkeys(task_ids)}
    for path in sorted((stack.workdir / "logs").glob("*.log")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            for task_id, found in lines.items():
                if task_id in line and len(found) < 40:
                    found.append(f"{path.name}: {line[:400]}")
    for task_id, found in lines.items():
        print(f"\nlogs naming {task_id}:", *found, sep="\n  ")


def generations_deleted(stack: EmbeddedStack) -> int:
    """Topic generations the batchers deleted, from their logs (a batcher started again
    appends to its log)."""
    return sum(
        path.read_text(encoding="utf-8", errors="replace").count("deleted a finished topic generation")
        for path in (stack.workdir / "logs").glob("batcher*.log")
    )


def phase(name: str) -> None:
    """A line in the soak's output as each step after the load begins: where a run that
    ends at its timeout spent its time."""
    print(f"{time.strftime('%H:%M:%S')} soak: {name}", flush=True)


async def final_answers(clients: dict[str, Tenant], ledger: Ledger, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Each accepted task's answer once it is final (or its last answer at the deadline),
    read READERS at a time: a 30-minute soak accepts tens of thousands of tasks, and one
    read at a time on a busy machine (100 ms each) outran the wait before reading a tenth."""
    answers: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    left = set(ledger.tasks)

    async def read(task_id: str) -> None:
        status, body = await clients[ledger.tasks[task_id].tenant].call(ledger, "GET", f"/v1/tasks/{task_id}")
        if status == 404 and task_id in ledger.seen_final:  # read final before, kept a while after
            body, status = ledger.seen_final[task_id], 200
            ledger.read_then_gone += 1
        if status == 200:
            answers[task_id] = body
            if body["status"] in FINAL:
                left.discard(task_id)

    while left and time.monotonic() < deadline:
        pending = sorted(left)
        for start in range(0, len(pending), READERS):
            if time.monotonic() > deadline:
                break  # a pass over thousands of tasks must not outrun the wait it is given
            await asyncio.gather(*(read(task_id) for task_id in pending[start : start + READERS]))
        if left:
            await asyncio.sleep(1.0)
    return answers


async def batchers_at_the_end(operator: Tenant, ledger: Ledger) -> dict[str, int]:
    """Each model's batchers on the status board, once it shows the shape (2 each) or 60 s
    on: a batcher that cannot start again after a fault must not go unseen."""
    counts: dict[str, int] = {}

    async def shape_held() -> bool:
        for model in MODELS:
            status, body = await operator.call(ledger, "GET", "/v1/stats", params={"model": model})
            # One entry a topic generation: count the processes.
            counts[model] = (
                len({entry.get("batcher", entry["member"]) for entry in body["batchers"]}) if status == 200 else 0
            )
        return all(count >= 2 for count in counts.values())

    try:
        await wait_for(shape_held, 60, "two batchers of each model on the status board", interval_s=1.0)
    except AssertionError:
        pass  # reported by the ledger, with the counts
    return counts


async def check_ledger(
    stack: EmbeddedStack, clients: dict[str, Tenant], operator: Tenant, ledger: Ledger
) -> tuple[dict[str, Any], list[str]]:
    answers = await final_answers(clients, ledger, timeout_s=300)
    letters = collections.Counter(letter.request.task_id for letter in await read_dead_letters(stack))
    problems: list[str] = []
    outcome: collections.Counter[str] = collections.Counter()
    lost_to_redis = 0  # a cancel or result Redis lost with its last second (AOF everysec)

    def near_redis_kill(at: float) -> bool:
        return any(0 <= kill - at <= 3.0 for kill in ledger.redis_kills)

    for task_id, task in ledger.tasks.items():
        answer = answers.get(task_id)
        status = answer["status"] if answer else "missing"
        outcome[status] += 1
        if answer is None or status not in FINAL:
            problems.append(f"not final: {task_id} ({status}, {task.text[:30]!r})")
        elif status == "done":
            if answer["outputs"] != expected_outputs(task.text) or task.text.startswith("!fail"):
                problems.append(
                    f"wrong result: {task_id} ({task.tenant}, {task.model}, {task.text!r}; answered for"
                    f" {answer.get('task_id')}, cached {answer.get('cached')}: {answer['outputs']},"
                    f" expected {expected_outputs(task.text)})"
                )
            if task.cancelled:
                if near_redis_kill(task.cancelled_at):
                    lost_to_redis += 1
                else:
                    problems.append(f"cancelled (200), then computed: {task_id}")
        elif status == "failed" and letters[task_id] < 1:
            problems.append(f"failed without a dead letter: {task_id}")
        elif status == "cancelled" and not task.cancelled and not task.cancel_in_doubt:
            problems.append(f"cancelled, though nobody asked: {task_id}")
        elif status == "expired" and not task.deadline_ms:
            problems.append(f"expired without a deadline: {task_id}")
    reopened = [
        (task_id, at) for task_id, at in ledger.changed if not any(0 <= at - kill <= 10 for kill in ledger.redis_kills)
    ]
    problems += [f"a done answer changed: {task_id}" for task_id, _ in reopened]
    problems += [f"Idempotency-Key retry: {line}" for line in ledger.duplicates]
    problems += ledger.cross_reads

    redis = Redis.from_url(stack.settings.redis_url)
    keys = RedisKeys(stack.settings.key_prefix)
    # A task an API worker recorded just before it was killed counts until the sweep takes it
    # out (api/tasks/group_commit.py): the counts are read until they fall to 0, or that long.
    deadline = time.monotonic() + released_within_s(stack.settings) + 10
    try:
        while True:
            in_flight = {tenant: await redis.zcard(keys.in_flight(tenant)) for tenant in TENANTS}
            if not any(in_flight.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        now_ms = int((await redis.time())[0]) * 1000
        leases = 0
        async for key in redis.scan_iter(match=f"{stack.settings.key_prefix}:slots:*"):
            leases += await redis.zcount(key, now_ms, "+inf")
    finally:
        await redis.aclose()
    problems += [f"{tenant} still counts {count} tasks in flight" for tenant, count in in_flight.items() if count]
    batchers = await batchers_at_the_end(operator, ledger)
    problems += [f"{model} has {count} batchers at the end, not 2" for model, count in batchers.items() if count < 2]
    if leases:
        problems.append(f"{leases} model slots still leased at quiescence")

    texts = {task.text for task in ledger.tasks.values()}
    seen = collections.Counter(rows_seen_by_model(stack))
    rows = sum(count for text, count in seen.items() if text in texts)
    # Rows of inputs that never fail: a batch holding a failing row is split and run again
    # (poison isolation), so its good neighbours reach the model more than once.
    good = [task.text for task in ledger.tasks.values() if not task.text.startswith(("!fail", "!flaky"))]
    good_rows = sum(seen[text] for text in set(good))
    figures = {
        "accepted (202)": len(ledger.tasks),
        "done, correct": outcome["done"] - sum(1 for p in problems if p.startswith("wrong result")),
        "failed, each with its dead letter": outcome["failed"],
        "cancelled as asked": outcome["cancelled"],
        "expired past their deadline (never computed)": outcome["expired"],
        "not final at the end": sum(1 for p in problems if p.startswith("not final")),
        "lost, wrong or reopened": sum(
            1 for p in problems if p.startswith(("wrong", "failed without", "a done answer", "expired without"))
        ),
        "Idempotency-Key retries / second tasks": f"{ledger.idempotency_retries} / {len(ledger.duplicates)}",
        "cross-tenant probes / reads": f"{ledger.cross_probes} / {len(ledger.cross_reads)}",
        "DLQ entries replayed": ledger.replays,
        "answers seen to change just after a Redis kill (its lost last second)": len(ledger.changed) - len(reopened),
        "cancels lost with Redis's last second": lost_to_redis,
        "in flight at the end / slots leased": f"{sum(in_flight.values())} / {leases}",
        "batchers of each model at the end": batchers,
        "model rows per accepted task": round(rows / max(1, len(ledger.tasks)), 3),
        "model rows per accepted task whose input never fails": round(good_rows / max(1, len(good)), 3),
        "answers": dict(sorted(ledger.answers.items())),
    }
    return figures, problems


def write_report(path: Path, figures: dict[str, object], schedule: list[tuple[float, str]]) -> None:
    """Rewrite the page's figures; the sections after them (findings, from ``## `` on) stay."""

    def cell(value: object) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{key} {count}" for key, count in value.items())
        return str(value)

    rows = "\n".join(f"| {name} | {cell(value)} |" for name, value in figures.items())
    kinds = collections.Counter(fault for _, fault in schedule)
    kept = ""
    if path.exists() and "\n## " in path.read_text():
        kept = "\n## " + path.read_text().split("\n## ", 1)[1]
    path.write_text(
        "# The chaos soak: the last run's figures\n\n"
        "`make soak` (tests/faults/test_chaos_soak.py with BRIMFUL_SOAK_S and BRIMFUL_SOAK_REPORT) runs Brimful in the\n"
        "production shape (2 API workers, 2 batchers for each of 2 models on 4 partitions, 2 model endpoints, auth on\n"
        f"with 3 tenants, {BROKER_SHAPES[BROKER]}, "
        "Redis syncing its log every second, "
        f"{f'the requests topics rotating every {ROTATION_S:g} s' if ROTATION_S else 'one requests topic a model'}"
        ") under a mixed load, while a\n"
        "seeded schedule injects a fault every 20 s or less and a batch job (OpenAI's Batch API) runs through them.\n"
        "At quiescence a ledger checks every task that got a 202 and every line of the job (see the module's\n"
        "docstring). `make test` runs the same soak for 150 s. A run rewrites these figures.\n\n"
        f"Last run ({time.strftime('%Y-%m-%d')}, {figures['seconds']} s, seed {figures['seed']}; "
        f"`make soak SOAK_S={SOAK_S:g}{'' if BROKER == 's3' else f' SOAK_BROKER={BROKER}'}"
        f"{'' if str(path) == 'bench/results/soak.md' else f' SOAK_REPORT={path}'}`"
        f"{'' if SEED == 7 else f' with BRIMFUL_SOAK_SEED={SEED}'}"
        f"{f' with BRIMFUL_SOAK_ROTATION_S={ROTATION_S:g}' if ROTATION_S else ''}):\n\n"
        f"| figure | value |\n|---|---|\n{rows}\n\n"
        f"Faults: {', '.join(f'{kind} {count}' for kind, count in sorted(kinds.items()))}.\n{kept}"
    )

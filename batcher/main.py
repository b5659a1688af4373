"""Start a batcher process: ``python -m brimful.batcher`` (settings from BRIMFUL_* env vars)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from brimful.batcher.generations import GenerationNotStarted, GenerationRun, Generations
from brimful.batcher.health_server import HealthServer, Probes
from brimful.batcher.limits import BatcherLimits
from brimful.batcher.service import BatcherService
from brimful.batcher.topic_admin import LiveGenerations, TopicAdmin
from brimful.batcher.traces import ArrivalRecorder
from brimful.batcher.upkeep import supervise
from brimful.core.dead_letter_index import DeadLetterIndex
from brimful.core.fetch_pacer import FetchPacer
from brimful.core.heap import freeze_startup_heap
from brimful.core.kafka import ensure_topics, make_admin, make_consumer, make_producer, record_limit
from brimful.core.logs import configure_logging
from brimful.core.metrics_exposition import exposition_with_labels
from brimful.core.model_catalogue import ModelSignature
from brimful.core.model_metadata import wait_for_signature
from brimful.core.policy_params import PolicyParams
from brimful.core.policy_tuning import PolicyTuning
from brimful.core.redis_client import RedisClient, follow_channel, make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings, get_settings
from brimful.core.shutdown_step import CLOSE_S, bounded_step
from brimful.core.stats import SharedStats
from brimful.core.status_board import StatusBoard
from brimful.core.task_store import TaskStore
from brimful.core.tracing import configure_tracing
from brimful.core.webhook_records import TaskEvents, WebhookRecords
from brimful.workers.batch_runner import BatchRunner
from brimful.workers.dead_letters import DeadLetterWriter
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.model_pool import EndpointLeases, ModelPool, Resolver, resolve_all
from brimful.workers.retry_policy import BatchRetryPolicy
from brimful.workers.shared_rows import ResultCache
from brimful.workers.triton_model import TritonModel

log = logging.getLogger("brimful.batcher")


async def announce(redis: RedisClient, channel: str, message: str) -> None:
    """Publish news other batchers act on; Redis away costs only the news (each batcher
    still learns from its own calls)."""
    try:
        await asyncio.wait_for(redis.publish(channel, message), timeout=2.0)
    except Exception as error:
        log.warning("could not announce", extra={"channel": channel, "error": repr(error)})


def model_pool(settings: Settings, redis: RedisClient, keys: RedisKeys, resolve: Resolver = resolve_all) -> ModelPool:
    """The pool of model endpoints the settings name (names resolved by ``resolve`` when
    ``triton_resolve_dns`` is on)."""
    endpoints = EndpointPool(
        settings.endpoint_capacity,
        lambda: CircuitBreaker(
            failure_threshold=settings.breaker_failure_threshold,
            max_open_s=settings.breaker_max_open_s,
            probe_timeout_s=2 * settings.infer_timeout_s + 1,
        ),
        instances=settings.endpoint_instances,
    )
    return ModelPool(
        settings.triton_endpoints,
        endpoints,
        lambda url: TritonModel(url, settings.model_name, settings.model_version, settings.infer_timeout_s),
        0,  # rows a call: the model's own, set once its signature is read
        # A lease outlives the longest call (and its client-side grace) it covers.
        leases=(
            EndpointLeases(
                redis, keys, ttl_s=settings.infer_timeout_s + 5, model=settings.model_scope(settings.model_name)
            )
            if settings.endpoint_leases
            else None
        ),
        resolve=resolve if settings.triton_resolve_dns else None,
        resolve_every_s=settings.endpoint_resolve_s,
        slot_wait_s=settings.slot_wait_s,
    )


class BatcherProcess:
    """A batcher process's connections (Redis, the model pool, the producer, the admin
    client, tracing) and what it closes at the end, each step bounded."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = make_redis(settings)
        self.keys = RedisKeys(settings.key_prefix)
        self.pool = model_pool(settings, self.redis, self.keys)
        self.producer = make_producer(settings)
        self.admin = make_admin(settings)
        self.tracing = configure_tracing(settings, "brimful-batcher")
        self.closers: list[tuple[str, Callable[[], Awaitable[None]]]] = []  # (step name, closer)
        if self.tracing is not None:
            tracing = self.tracing
            self.closers.append(("tracing", lambda: asyncio.to_thread(tracing.shutdown)))  # flushes the exporter

    async def model_signature(self, stop: asyncio.Event) -> ModelSignature | None:
        """The model's signature, once its endpoints resolve and one answers; None if
        ``stop`` came first."""
        await self.pool.refresh()
        while not self.pool.pool.endpoints and not stop.is_set():  # names that resolve to nothing yet
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.endpoint_resolve_s)
            except TimeoutError:
                await self.pool.refresh()
        if stop.is_set():
            return None
        signature = await wait_for_signature(self.pool.any_model(), stop)
        if signature is not None:
            self.pool.batch_size = signature.batch_size  # the model's configuration says it, not a setting
        return signature

    async def assemble(self, signature: ModelSignature) -> Batcher:
        """The batcher of this model: its runner, dead letters and live policy."""
        settings, redis, keys = self.settings, self.redis, self.keys
        scope = settings.model_scope(settings.model_name)  # this model's own counters and policy
        await self.producer.start()
        dead_letters = DeadLetterWriter(
            self.producer,
            settings.dlq_topic,
            await record_limit(settings, [settings.dlq_topic]),
            DeadLetterIndex(redis, keys, settings.task_wait_ttl_s),
        )
        retry = BatchRetryPolicy(
            max_attempts=settings.max_attempts,
            base_delay=settings.retry_backoff_ms / 1000,
            max_delay=settings.retry_backoff_max_ms / 1000,
        )
        store = TaskStore(redis, keys, settings.result_ttl_s, settings.task_wait_ttl_s, stats_model=scope)
        runner = BatchRunner(
            pool=self.pool,
            signature=signature,
            store=store,
            stats=SharedStats(redis, keys, scope),
            dead_letters=dead_letters,
            retry=retry,
            transient_give_up_s=settings.transient_give_up_s,
            isolation=IsolationBudget(settings.tenant_isolation_calls_per_s, settings.tenant_isolation_burst),
            tracing=self.tracing,
            cache=ResultCache(settings.result_cache_max_bytes) if settings.result_cache_max_bytes else None,
            cacheable=settings.cacheable(settings.model_name),
            cache_across_tenants=settings.result_cache_across_tenants,
            task_events=TaskEvents(
                WebhookRecords(redis, keys), store, settings.default_model, settings.webhook_callback_payload
            ),
            provenance=settings.task_provenance,
        )
        member = f"{socket.gethostname()}-{os.getpid()}"
        recorder = ArrivalRecorder(Path(settings.trace_dir), member) if settings.trace_dir else None
        tuning = PolicyTuning.from_settings(settings, redis, settings.model_name, signature.batch_size)
        factory = ServiceFactory(self, signature, runner, retry, dead_letters, await tuning.params(), recorder, member)
        return Batcher(self, signature, factory, tuning, recorder, member)

    async def close(self) -> None:
        # Each step bounded: a broker or Redis gone quiet must not hold the process past
        # its grace period with nothing said.
        for name, close in self.closers:
            await bounded_step(name, close(), CLOSE_S)
        # Every send was awaited by the batch it belongs to: nothing is left to flush.
        await bounded_step("producer", self.producer.stop(), CLOSE_S)
        await bounded_step("model pool", self.pool.close(), CLOSE_S)
        await bounded_step("redis", self.redis.aclose(), CLOSE_S)


@dataclass(frozen=True)
class ServiceFactory:
    """Makes a generation's consumer and batcher service from the process's parts, and
    runs it (``batcher/generations.py`` calls it for each generation it joins)."""

    process: BatcherProcess
    signature: ModelSignature
    runner: BatchRunner
    retry: BatchRetryPolicy
    dead_letters: DeadLetterWriter
    params: PolicyParams  # the policy read at start, for the first generation
    recorder: ArrivalRecorder | None
    member: str

    @property
    def settings(self) -> Settings:
        return self.process.settings

    def open(self, number: int, topic: str, current: GenerationRun | None) -> tuple[AIOKafkaConsumer, BatcherService]:
        settings = self.settings
        consumer = make_consumer(settings, settings.consumer_group_for(settings.model_name, number))
        service = BatcherService(
            consumer=consumer,
            topic=topic,
            runner=self.runner,
            pool=self.process.pool,
            retry=self.retry,
            dead_letters=self.dead_letters,
            # A new generation starts with the live policy the others have now.
            params=current.service.params if current is not None else self.params,
            limits=BatcherLimits.from_settings(settings),
            on_arrival=self.recorder.record if self.recorder else None,
            fetch_pacer=FetchPacer(
                consumer, settings.kafka_fetch_max_wait_ms, settings.kafka_fetch_lagging_max_wait_ms, "batcher"
            ),
            keep_trace_context=self.process.tracing is not None,
        )
        return consumer, service

    async def run(self, run: GenerationRun) -> None:
        try:
            try:
                await run.consumer.start()
            except KafkaError as error:  # the broker away: the generation is started again
                raise GenerationNotStarted(f"{run.topic}: {error!r}") from error
            log.info(
                "batcher started",
                extra={
                    "topic": run.topic,
                    "model": self.signature.name,
                    "batch_size": self.signature.batch_size,
                    "member": self.member,
                },
            )
            await run.service.run(run.stop)
        finally:
            # Leaves the group: a request, bounded like every step of a stop.
            await bounded_step("consumer", run.consumer.stop(), self.settings.kafka_request_timeout_ms / 1000)


class Batcher:
    """One model's batcher: a service for each generation of its requests topic, sharing
    the process's runner and pool, with its probes, live tuning and news from the others."""

    def __init__(
        self,
        process: BatcherProcess,
        signature: ModelSignature,
        factory: ServiceFactory,
        tuning: PolicyTuning,
        recorder: ArrivalRecorder | None,
        member: str,
    ) -> None:
        self.process = process
        self.settings = process.settings
        self.signature = signature
        self.tuning = tuning
        self.recorder = recorder
        self.member = member
        self.board = StatusBoard(process.redis, process.keys)
        topics = TopicAdmin(self.settings, process.admin)
        self.topic_generations = self.settings.topic_generations_for(self.settings.model_name)
        self.generations = Generations(
            self.topic_generations,
            factory,
            list_topics=topics.list_topics,
            create_topics=topics.create_topics,
            delete_topic=topics.delete_topic,
            held_by_live_batchers=LiveGenerations(
                self.board, self.settings.model_name, self.settings.redis_timeout_s
            ).held,
            wall_clock=time.time,
            live_fetch_wait_ms=self.settings.kafka_fetch_max_wait_ms,
        )
        self._announcements: set[asyncio.Task[None]] = set()

    def current_service(self) -> BatcherService | None:
        run = self.generations.current
        return run.service if run is not None else None

    def seconds_since_fetch(self) -> float | None:
        services = self.generations.services
        ages = [age for service in services if (age := service.seconds_since_fetch()) is not None]
        return min(ages) if ages else None

    def status(self) -> dict[str, object]:
        service = self.current_service()
        return {
            "member": self.member,
            "model": self.settings.model_name,
            "generations": sorted(self.generations.running),
            **(service.snapshot() if service is not None else {}),
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        process, settings = self.process, self.settings
        if self.topic_generations.rotating:
            await process.admin.start()
            process.closers.append(("admin client", process.admin.close))
        if settings.batcher_metrics_port:
            health = self.health_server()
            await health.start()
            process.closers.append(("health server", health.close))
        freeze_startup_heap()
        process.pool.on_opened = self.announce_down
        background = [
            supervise(
                settings.model_name,
                self.generations,
                self.tuning,
                self.board,
                self.recorder,
                self.member,
                settings.tuning_poll_ms / 1000,
                stop,
            ),
            self.follow(process.keys.model_cancelled_channel(self.scope), self.generations.cancel, stop),
            self.follow(process.keys.model_endpoint_down_channel(self.scope), self.generations.endpoint_down, stop),
            process.pool.keep_resolved(stop),
        ]
        tasks = [asyncio.create_task(job) for job in background]
        await self.generations.run(stop)
        for task in tasks:
            await task

    @property
    def scope(self) -> str | None:
        return self.settings.model_scope(self.settings.model_name)

    def health_server(self) -> HealthServer:
        """``/metrics`` and the probes, on the settings' port."""
        settings, generations = self.settings, self.generations
        return HealthServer(
            settings.batcher_metrics_host,
            settings.batcher_metrics_port,
            Probes(
                seconds_since_fetch=self.seconds_since_fetch,
                slots_stalled_s=lambda: max((s.slots_stalled_s() for s in generations.services), default=0.0),
                stall_after_s=2 * settings.slot_wait_s,
                consuming=lambda: any(service.running for service in generations.services),
                status=self.status,
                metrics_text=exposition_with_labels({"model": settings.model_name}),
            ),
        )

    async def follow(self, channel: str, act: Callable[[str], object], stop: asyncio.Event) -> None:
        """Act on every message of a Redis channel until ``stop``: tasks cancelled while
        they wait in this batcher's accumulators, endpoints another batcher found down."""
        await follow_channel(self.process.redis, channel, lambda message: act(message.decode()), stop=stop)

    def announce_down(self, url: str) -> None:
        """Endpoint health shared: a circuit one batcher opens, every batcher opens at
        once, instead of each learning from its own failed calls."""
        channel = self.process.keys.model_endpoint_down_channel(self.scope)
        task = asyncio.create_task(announce(self.process.redis, channel, url))
        self._announcements.add(task)
        task.add_done_callback(self._announcements.discard)


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Run one batcher until ``stop`` is set."""
    await ensure_topics(settings)
    process = BatcherProcess(settings)
    try:
        signature = await process.model_signature(stop)
        if signature is not None:
            await (await process.assemble(signature)).run(stop)
    finally:
        await process.close()


def main() -> None:
    settings = get_settings()
    configure_logging()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, stop)

    try:
        import uvloop  # installed with uvicorn[standard]; where missing, asyncio's own loop
    except ImportError:
        asyncio.run(run())
    else:
        # Side by side on the local stack: 10-20% less batcher CPU a task than asyncio's loop.
        uvloop.run(run())

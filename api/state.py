"""What the API process holds while it runs: its clients and stores, and the background
work that keeps them current."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiokafka import AIOKafkaProducer
from fastapi import Request

from brimful.api.admin.dead_letter_admin import DeadLetterAdmin
from brimful.api.http.bodies import unknown_model
from brimful.api.openai.upload_gate import UploadGate
from brimful.api.tasks.backlog import BacklogMonitor
from brimful.api.tasks.group_commit import GroupCommitter, SubmissionReceipts, longest_submission_s
from brimful.api.tasks.task_waiters import ReadResults, TaskWaiters
from brimful.core import metrics
from brimful.core.api_keys import ApiKeyCache, ApiKeys
from brimful.core.batch_records import BatchRecords
from brimful.core.file_records import FileRecords
from brimful.core.kafka import ensure_topics, make_producer, record_limit
from brimful.core.model_catalogue import ModelCatalogue, UnknownModelError
from brimful.core.model_metadata import ModelMetadata, wait_for_signature
from brimful.core.object_store import ObjectStore
from brimful.core.policy_tuning import PolicyTuning
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.redis_memory import RedisMemory
from brimful.core.settings import Settings
from brimful.core.shutdown_step import CLOSE_S, bounded_step
from brimful.core.stats import SharedStats
from brimful.core.status_board import StatusBoard
from brimful.core.task_store import TaskStore
from brimful.core.tenant_limits import RateLimiter, TenantLimits, TenantLimitStore
from brimful.core.tracing import configure_tracing
from brimful.core.webhook_records import WebhookRecords

log = logging.getLogger("brimful.api")


class ApiState:
    """What the API holds while it runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = make_redis(settings)
        keys = RedisKeys(settings.key_prefix)
        self.store = TaskStore(self.redis, keys, settings.result_ttl_s, settings.task_wait_ttl_s)
        self._keys = keys
        self.producer: AIOKafkaProducer = make_producer(settings)
        self.producer_started = False
        # The largest record the requests topics take: the setting until the broker says less.
        self.record_limit = settings.kafka_max_message_bytes
        # Each served model as the first endpoint has it: its signature, and whether it is ready.
        self.models = [ModelMetadata.from_settings(settings, name) for name in settings.served_models]
        self.catalogue: ModelCatalogue | None = None  # the models served, once all their metadata is read
        self.status_board = StatusBoard(self.redis, keys)
        self.dead_letters = self._dead_letter_admin()
        self.topics = {name: settings.requests_topic_for(name) for name in settings.served_models}  # model -> its topic
        # model -> its topic's generations: where topics rotate, each send picks the current one
        self.generations = {name: settings.topic_generations_for(name) for name in settings.served_models}
        self.receipts = SubmissionReceipts(self.store.unconfirmed, longest_submission_s(settings))
        self.committers = self._committers()
        self.backlog = BacklogMonitor(
            self.status_board,
            {topic: (name, self.stats_of(name)) for name, topic in self.topics.items()},
            settings.requests_topic,
            generations={self.topics[name]: self.generations[name] for name in settings.served_models},
        )
        metrics.BACKLOG_LIMIT_ROWS.set(settings.max_backlog)
        self.tracing = configure_tracing(settings, "brimful-api")
        self.waiters = TaskWaiters(self.redis, keys, self.store, settings.tenant_max_long_polls)
        self.read_results = ReadResults(self.redis, keys, settings.result_ttl_after_read_s)
        self.redis_memory = RedisMemory(self.redis, settings.redis_admission_memory_ratio)
        self.api_keys = ApiKeyCache(
            ApiKeys(self.redis, keys), self.redis, keys.revoked_keys_channel, settings.api_key_cache_s
        )
        self.rate_limiter, self.read_limiter, self.dlq_limiter = self._rate_limiters()
        self.tenant_limits = TenantLimitStore(
            self.redis,
            keys,
            TenantLimits(
                settings.tenant_max_payload_bytes, settings.tenant_max_in_flight, settings.tenant_max_stored_bytes
            ),
        )
        self.object_store = ObjectStore.from_url(settings.file_store_url)
        self.file_records = FileRecords(self.redis, keys)
        self.upload_gate = UploadGate(
            settings.file_uploads_per_tenant,
            settings.file_max_bytes,
            RateLimiter(
                self.redis,
                keys.upload_bucket,
                settings.file_upload_rate_per_s,
                settings.file_upload_burst,
                "uploads",
                settings.rate_limit_lease_ms / 1000,
            ),
            self.file_records,
            self.tenant_limits,
        )
        self.batch_records = BatchRecords(self.redis, keys)
        self.webhooks = WebhookRecords(self.redis, keys)
        self.webhook_hosts = settings.webhook_hosts
        self._background: list[asyncio.Task[None]] = []
        self._serving = asyncio.Event()  # set once the signature is known and the producer is up

    def _committers(self) -> dict[str, GroupCommitter]:
        """One group committer a model: a group is one send to one topic."""
        settings = self.settings
        return {
            name: GroupCommitter(
                self.store,
                self.producer,
                self.generations[name],
                settings.submit_group_max,
                settings.submit_waiting_max,
                min_gap_s=settings.submit_group_gap_ms / 1000,
                max_unacknowledged=settings.submit_groups_unacknowledged,
                receipts=self.receipts,
            )
            for name in settings.served_models
        }

    def _rate_limiters(self) -> tuple[RateLimiter, RateLimiter, RateLimiter]:
        """Each tenant's rate of tasks, of reads and of DLQ calls."""
        settings, keys = self.settings, self._keys
        lease_s = settings.rate_limit_lease_ms / 1000
        return (
            RateLimiter(
                self.redis, keys.rate_bucket, settings.rate_limit_per_s, settings.rate_limit_burst, "tasks", lease_s
            ),
            RateLimiter(
                self.redis,
                keys.read_bucket,
                settings.read_rate_limit_per_s,
                settings.read_rate_limit_burst,
                "reads",
                lease_s,
            ),
            RateLimiter(
                self.redis,
                keys.dlq_bucket,
                settings.dlq_rate_limit_per_s,
                settings.dlq_rate_limit_burst,
                "DLQ calls",
                lease_s,
            ),
        )

    @property
    def serving(self) -> bool:
        """Whether this process can take a task: it knows the signature and reaches the broker."""
        return self._serving.is_set()

    async def wait_until_serving(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for :attr:`serving`; whether it holds. A request that
        lands on a just-started process waits out the start instead of a 503."""
        if not self._serving.is_set():
            try:
                await asyncio.wait_for(self._serving.wait(), timeout=timeout_s)
            except TimeoutError:
                pass
        return self._serving.is_set()

    def _note_started(self) -> None:
        if self.catalogue is not None and self.producer_started:
            self._serving.set()

    def run_in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Background work of another module (the batch jobs' driver), stopped with the rest."""
        self._background.append(asyncio.create_task(work, name=name))

    async def start(self) -> None:
        self._background += [
            asyncio.create_task(self._load_signature(), name="load-signature"),
            asyncio.create_task(self._start_producer(), name="start-producer"),
            asyncio.create_task(self.backlog.run(), name="backlog-monitor"),
            asyncio.create_task(self.waiters.run(), name="task-waiters"),
            asyncio.create_task(self.read_results.run(), name="read-results"),
            asyncio.create_task(self.redis_memory.run(), name="redis-memory"),
            asyncio.create_task(self.receipts.run(), name="submission-receipts"),
        ]
        if self.settings.topic_rotation_s:
            self._background.append(asyncio.create_task(self._keep_topics(), name="topic-generations"))
        if self.settings.auth_enabled:
            self._background.append(asyncio.create_task(self.api_keys.follow_revocations(), name="key-revocations"))

    async def stop(self) -> None:
        """Stop background work and close every client, each step bounded (see
        :func:`bounded_step`): the whole stop stays within
        ``kafka_request_timeout_ms + 10 s`` (uvicorn's 10 s for requests under way
        come before it), whatever answers or not."""
        request_s = self.settings.kafka_request_timeout_ms / 1000
        for task in self._background:
            task.cancel()
        await bounded_step("background tasks", asyncio.gather(*self._background, return_exceptions=True), CLOSE_S)
        # Submissions under way finish first: the broker's timeout bounds each of their
        # steps, and the committer answers whatever is left when its drain ends.
        drain_s = max(0.0, request_s - CLOSE_S)
        await bounded_step(
            "submissions", asyncio.gather(*(c.close(drain_s=drain_s) for c in self.committers.values())), request_s
        )
        # What the drain confirmed: written now, or the sweep releases it early elsewhere.
        await bounded_step("confirmations", self.receipts.flush(), CLOSE_S)
        if self.producer_started:
            # Nothing is left to send once the committer has drained: this only closes.
            await bounded_step("producer", self.producer.stop(), CLOSE_S)
        await bounded_step("model clients", asyncio.gather(*(m.close() for m in self.models)), CLOSE_S)
        await bounded_step("redis", self.redis.aclose(), CLOSE_S)
        if self.tracing is not None:
            # Flushing the exporter is blocking I/O: a thread, which cannot be cancelled.
            await bounded_step("tracing", asyncio.to_thread(self.tracing.shutdown), CLOSE_S)

    def topic_now(self, model: str) -> str:
        """The topic a task of ``model`` sent now goes to (its generation, where topics rotate)."""
        return self.generations[model].topic_at(time.time())

    async def _keep_topics(self) -> None:
        """Where topics rotate, create each generation's topic before its start, so no send
        waits on the broker to make it (or meets one auto-created with other settings), and
        keep the producer asking for the metadata of the generations in use only."""
        every_s = max(1.0, min(generations.lead_s for generations in self.generations.values()) / 2)
        while True:
            await asyncio.sleep(every_s)
            now = time.time()  # before the topics are made: no later generation is asked for
            try:
                await ensure_topics(self.settings, attempts=1)
            except Exception as error:
                # Asking for a topic not made yet would have the broker make it, with its own settings.
                log.warning("could not create the next topic generation", extra={"error": str(error)})
                continue
            self._track_topics_in_use(now)

    def _track_topics_in_use(self, now: float) -> None:
        """The producer keeps every topic it has sent to and asks for all of their metadata
        whenever it meets a new one, and the embedded broker creates a topic it is asked
        about: without this, each generation its batchers deleted came back at the next one,
        to be joined and deleted again, more of them every period. Its batchers delete a
        generation a grace after its end, later than a send to it can still be under way
        (``kafka_request_timeout_ms``), which is when it leaves this set. A new generation
        in the set has its metadata asked for now, before the first send to it."""
        if not self.producer_started:
            return
        in_flight_s = self.settings.kafka_request_timeout_ms / 1000
        topics = {topic for generations in self.generations.values() for topic in generations.in_use(now, in_flight_s)}
        self.producer.client.set_topics(sorted(topics))

    def served_model(self, name: str | None) -> str:
        """A served model's name (None: the default's); 422 ``unknown_model`` otherwise."""
        if name is None:
            return self.settings.default_model
        if name not in self.settings.served_models:
            raise unknown_model(UnknownModelError(name, self.settings.served_models))
        return name

    def stats_of(self, model: str) -> SharedStats:
        """The batching counters of a served model."""
        return SharedStats(self.redis, self._keys, self.settings.model_scope(model))

    def tuning_of(self, model: str) -> PolicyTuning:
        """The live policy of a served model. Changes are checked against its rows a call
        (the configured reference size until its signature is read)."""
        signature = self.catalogue.models.get(model) if self.catalogue is not None else None
        batch_size = signature.batch_size if signature is not None else self.settings.batch_size
        return PolicyTuning.from_settings(self.settings, self.redis, model, batch_size)

    async def _load_signature(self) -> None:
        # The models may still be loading when the API starts: keep asking each.
        signatures = await asyncio.gather(*(wait_for_signature(model) for model in self.models))
        if all(signature is not None for signature in signatures):
            shortenable = self.settings.shortenable
            self.catalogue = ModelCatalogue.of(
                [dataclasses.replace(s, shortenable=shortenable(s.name)) for s in signatures if s is not None]
            )
        self._note_started()

    def _requests_topics_now(self) -> list[str]:
        return [topic for generations in self.generations.values() for topic in generations.upcoming(time.time())]

    def _dead_letter_admin(self) -> DeadLetterAdmin:
        """The DLQ's admin on the producer held now (made again while the broker is awaited)."""
        return DeadLetterAdmin(
            self.settings, self.redis, self.producer, self.store, read_max=self.settings.dlq_read_max_letters
        )

    async def _start_producer(self) -> None:
        delay = 0.2
        while not self.producer_started:
            try:
                await ensure_topics(self.settings, attempts=1)
                self.record_limit = await record_limit(self.settings, self._requests_topics_now())
                await self.producer.start()
                self.producer_started = True
                self._note_started()
            except Exception as error:
                log.info("waiting for the broker", extra={"error": str(error)})
                await self.producer.stop()
                self.producer = make_producer(self.settings)
                for committer in self.committers.values():
                    committer.producer = self.producer
                self.dead_letters = self._dead_letter_admin()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


def api_state(request: Request) -> ApiState:
    """The running API's state, from any route."""
    state: ApiState = request.app.state.brimful
    return state

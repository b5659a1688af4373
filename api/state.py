"""What the API holds while it runs, and the small request helpers every route uses."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from fastapi import Request

from api.backlog import BacklogMonitor
from api.errors import ApiError
from api.rate_limit import RateLimiter
from api.task_waiters import TaskWaiters
from batcher.live_status import StatusBoard
from brimful.api_keys import ApiKeys
from batcher.tuning import PolicyTuning
from brimful.kafka import ensure_topics, make_producer
from brimful.model_signature import ModelSignature
from brimful.redis_client import make_redis
from brimful.redis_keys import RedisKeys
from brimful.settings import Settings
from brimful.task_store import TaskStore
from brimful.tenant_limits import TenantLimits, TenantLimitStore
from workers.dead_letter_admin import DeadLetterAdmin
from workers.triton_model import TritonModel

log = logging.getLogger("brimful.api")


class ApiState:
    """What the API holds while it runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = make_redis(settings)
        self.store = TaskStore(self.redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
        self.producer: AIOKafkaProducer = make_producer(settings)
        self.producer_started = False
        self.model = TritonModel(
            settings.triton_url, settings.model_name, settings.model_version, settings.batch_size, settings.infer_timeout_s
        )
        self.signature: ModelSignature | None = None
        self.tuning = PolicyTuning.from_settings(settings, self.redis)
        self.status_board = StatusBoard(self.redis, RedisKeys(settings.key_prefix))
        self.dead_letters = DeadLetterAdmin(settings, self.redis, self.producer, self.store)
        self.backlog = BacklogMonitor(self.status_board, self.store)
        self.waiters = TaskWaiters(self.redis, RedisKeys(settings.key_prefix))
        self.api_keys = ApiKeys(self.redis, RedisKeys(settings.key_prefix))
        self.rate_limiter = RateLimiter(
            self.redis, RedisKeys(settings.key_prefix), settings.rate_limit_per_s, settings.rate_limit_burst
        )
        self.tenant_limits = TenantLimitStore(
            self.redis,
            RedisKeys(settings.key_prefix),
            TenantLimits(settings.tenant_max_payload_bytes, settings.tenant_max_in_flight),
        )
        self._background: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._background = [
            asyncio.create_task(self._load_signature(), name="load-signature"),
            asyncio.create_task(self._start_producer(), name="start-producer"),
            asyncio.create_task(self.backlog.run(), name="backlog-monitor"),
            asyncio.create_task(self.waiters.run(), name="task-waiters"),
        ]

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.producer_started:
            await self.producer.stop()
        await self.model.close()
        await self.redis.aclose()

    async def _load_signature(self) -> None:
        # The model may still be loading when the API starts: keep asking.
        delay = 0.2
        while self.signature is None:
            try:
                self.signature = await self.model.signature()
                log.info("model signature loaded", extra={"model": self.signature.name, "inputs": self.signature.input_names})
            except Exception as error:
                log.info("waiting for model metadata", extra={"error": str(error)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _start_producer(self) -> None:
        delay = 0.2
        while not self.producer_started:
            try:
                await ensure_topics(self.settings, attempts=1)
                await self.producer.start()
                self.producer_started = True
            except Exception as error:
                log.info("waiting for the broker", extra={"error": str(error)})
                await self.producer.stop()
                self.producer = make_producer(self.settings)
                self.dead_letters = DeadLetterAdmin(self.settings, self.redis, self.producer, self.store)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"body of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
    return bytes(body)


def api_state(request: Request) -> ApiState:
    return request.app.state.brimful  # type: ignore[no-any-return]

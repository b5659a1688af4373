"""Start a batcher process: ``python -m batcher`` (settings from BRIMFUL_* env vars)."""

from __future__ import annotations

import asyncio
import logging
import signal

from redis.asyncio import Redis

from batcher.policy import PolicyParams
from batcher.service import BatcherLimits, BatcherService
from brimful.kafka import ensure_topics, make_consumer, make_producer
from brimful.logs import configure_logging
from brimful.model_signature import ModelSignature
from brimful.redis_keys import RedisKeys
from brimful.settings import Settings, get_settings
from brimful.task_store import TaskStore
from workers.batch_runner import BatchRunner
from workers.dead_letters import DeadLetterWriter
from workers.retry_policy import RetryPolicy
from workers.triton_model import TritonModel

log = logging.getLogger("brimful.batcher")


def policy_params(settings: Settings) -> PolicyParams:
    """The flush policy's parameters as configured (settings are in ms, the policy in s)."""
    return PolicyParams(
        batch_size=settings.batch_size,
        max_wait=settings.max_wait_ms / 1000,
        min_wait=settings.min_wait_ms / 1000,
        rate_halflife=settings.rate_halflife_ms / 1000,
        fill_slack=settings.fill_slack,
        min_worthwhile_rows=settings.min_worthwhile_rows,
    )


async def wait_for_signature(model: TritonModel, stop: asyncio.Event) -> ModelSignature | None:
    """Poll Triton until the model's metadata is available (it may still be loading)."""
    delay = 0.2
    while not stop.is_set():
        try:
            return await model.signature()
        except Exception as error:
            log.info("waiting for the model", extra={"model": model.model_name, "error": str(error)})
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except asyncio.TimeoutError:
            delay = min(delay * 2, 2.0)
    return None


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Run one batcher until ``stop`` is set."""
    await ensure_topics(settings)
    model = TritonModel(
        settings.triton_url, settings.model_name, settings.model_version, settings.batch_size, settings.infer_timeout_s
    )
    redis = Redis.from_url(settings.redis_url)
    producer = make_producer(settings)
    consumer = make_consumer(settings, settings.consumer_group)
    try:
        signature = await wait_for_signature(model, stop)
        if signature is None:
            return
        await producer.start()
        dead_letters = DeadLetterWriter(producer, settings.dlq_topic)
        runner = BatchRunner(
            model=model,
            signature=signature,
            store=TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s),
            dead_letters=dead_letters,
            retry=RetryPolicy(
                max_attempts=settings.max_attempts,
                base_delay=settings.retry_backoff_ms / 1000,
                max_delay=settings.retry_backoff_max_ms / 1000,
            ),
        )
        service = BatcherService(
            consumer=consumer,
            topic=settings.requests_topic,
            runner=runner,
            dead_letters=dead_letters,
            params=policy_params(settings),
            limits=BatcherLimits(
                max_in_flight=settings.max_in_flight,
                max_in_flight_per_partition=settings.max_in_flight_per_partition,
                max_pending_per_partition=settings.max_pending_per_partition,
                commit_timeout_s=settings.kafka_commit_timeout_s,
            ),
        )
        await consumer.start()
        log.info("batcher started", extra={"topic": settings.requests_topic, "model": signature.name})
        await service.run(stop)
    finally:
        await consumer.stop()
        await producer.stop()
        await model.close()
        await redis.aclose()


def main() -> None:
    settings = get_settings()
    configure_logging()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, stop)

    asyncio.run(run())

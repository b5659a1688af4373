"""Kafka clients configured from settings, and topic creation. Broker-agnostic:
everything Tansu cannot do is a setting (``kafka_idempotence``), never a branch."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.helpers import create_ssl_context

from brimful.core.settings import Settings

log = logging.getLogger("brimful.kafka")


def connection_options(settings: Settings) -> dict[str, Any]:
    """Where the broker is and how to reach it (TLS, SASL): shared by every Kafka client
    Brimful makes, so producer, consumers and admin can never disagree."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "security_protocol": settings.kafka_security_protocol,
    }
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = create_ssl_context(
            cafile=settings.kafka_ssl_cafile or None,
            certfile=settings.kafka_ssl_certfile or None,
            keyfile=settings.kafka_ssl_keyfile or None,
        )
    if settings.kafka_security_protocol.startswith("SASL_"):
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_sasl_username
        options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
    return options


def make_producer(settings: Settings) -> AIOKafkaProducer:
    """A producer that waits for every in-sync replica: an accepted task is on disk."""
    return AIOKafkaProducer(
        **connection_options(settings),
        acks="all",
        enable_idempotence=settings.kafka_idempotence,
        linger_ms=settings.kafka_linger_ms,
        request_timeout_ms=settings.kafka_request_timeout_ms,
        # Checked here, before sending: a broker that refuses a record would fail it anyway.
        max_request_size=settings.kafka_max_message_bytes,
    )


def make_consumer(settings: Settings, group_id: str | None, topic: str | None = None) -> AIOKafkaConsumer:
    """A consumer with manual commits; timeouts short enough for quick rebalances."""
    topics = (topic,) if topic else ()
    return AIOKafkaConsumer(
        *topics,
        **connection_options(settings),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
        request_timeout_ms=settings.kafka_request_timeout_ms,
        max_partition_fetch_bytes=max(2 * settings.kafka_max_message_bytes, 1024 * 1024),
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
    )


async def ensure_topics(settings: Settings, attempts: int = 30) -> None:
    """Create the requests and DLQ topics if missing (idempotent; waits for the broker)."""
    wanted = [
        NewTopic(settings.requests_topic, settings.topic_partitions, settings.topic_replication),
        NewTopic(settings.dlq_topic, 1, settings.topic_replication),
    ]
    for attempt in range(1, attempts + 1):
        admin = AIOKafkaAdminClient(
            **connection_options(settings), request_timeout_ms=settings.kafka_request_timeout_ms
        )
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [topic for topic in wanted if topic.name not in existing]
            if missing:
                try:
                    await admin.create_topics(missing)
                except TopicAlreadyExistsError:
                    pass  # another process created it first
                log.info("created topics", extra={"topics": [t.name for t in missing]})
            return
        except KafkaError as error:
            if attempt == attempts:
                raise
            log.warning("broker not ready for topic creation", extra={"error": str(error), "attempt": attempt})
            await asyncio.sleep(min(1.0, 0.1 * attempt))
        finally:
            await admin.close()


async def read_whole_topic(settings: Settings, topic: str, timeout_s: float = 30.0) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` as (partition, offset, value), read from the start to the
    end. The end is the high watermark from fetch responses: a broker's "latest offset"
    answer is not trusted (Tansu's is wrong)."""
    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=200)
            for batch in fetched.values():
                records.extend((r.partition, r.offset, r.value) for r in batch)
            ends = [consumer.highwater(tp) for tp in partitions]
            positions = [await consumer.position(tp) for tp in partitions]
            if all(end is not None and position >= end for position, end in zip(positions, ends)):
                return records
        raise TimeoutError(f"could not read {topic} to its end within {timeout_s:g} s")
    finally:
        await consumer.stop()

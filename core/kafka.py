"""Kafka clients configured from settings, and topic creation. Broker-agnostic:
everything Tansu cannot do is a setting (``kafka_idempotence``), never a branch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.helpers import create_ssl_context

from brimful.core.fetch_pacer import FetchPacer
from brimful.core.settings import Settings
from brimful.core.shutdown_step import CLOSE_S, bounded_step

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


def make_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client of the settings' broker (not started)."""
    return AIOKafkaAdminClient(**connection_options(settings), request_timeout_ms=settings.kafka_request_timeout_ms)


def requests_topic_spec(settings: Settings, topic: str) -> NewTopic:
    """How a requests topic (or one of its generations) is created: the settings'
    partitions and replication."""
    return NewTopic(topic, settings.topic_partitions, settings.topic_replication)


async def ensure_topics(settings: Settings, attempts: int = 30) -> None:
    """Create every served model's requests topic (where topics rotate, its current and
    next generations) and the DLQ topic if missing (idempotent; waits for the broker)."""
    now = time.time()
    wanted = [
        *(
            requests_topic_spec(settings, topic)
            for model in settings.served_models
            for topic in settings.topic_generations_for(model).upcoming(now)
        ),
        NewTopic(settings.dlq_topic, 1, settings.topic_replication),
    ]
    for attempt in range(1, attempts + 1):
        admin = make_admin(settings)
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


async def record_limit(settings: Settings, topics: Sequence[str]) -> int:
    """The largest record every one of ``topics`` takes: the least of their
    ``max.message.bytes`` (which follows the broker's ``message.max.bytes`` unless a topic
    sets its own) and ``kafka_max_message_bytes``. A record the broker refuses as too large
    costs more than its own 413: the idempotent producer's later sends to that partition
    fail out of sequence. The setting alone where the broker does not say (KafkaError)."""
    limit = settings.kafka_max_message_bytes
    admin = make_admin(settings)
    try:
        await admin.start()
        resources = [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None}) for topic in topics]
        for response in await admin.describe_configs(resources):
            for _code, _message, _type, _name, entries in response.resources:
                for entry in entries:
                    if entry[0] == "max.message.bytes" and entry[1] is not None:
                        limit = min(limit, int(entry[1]))
    except KafkaError as error:
        log.warning("could not read the topics' record limit; using the setting", extra={"error": str(error)})
    finally:
        await admin.close()
    return limit


async def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """The partitions of ``topic`` as the broker describes it (none when it does not
    exist). A consumer's ``partitions_for_topic`` knows only topics its own metadata has
    asked about: on Apache Kafka a fresh, unsubscribed consumer knows none."""
    admin = make_admin(settings)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return sorted(
        int(partition["partition"])
        for entry in described
        if entry["topic"] == topic and not entry["error_code"]
        for partition in entry["partitions"]
    )


async def stream_topic(
    settings: Settings,
    topic: str,
    start: tuple[int, int] | None = None,
    stall_timeout_s: float = 30.0,
) -> AsyncGenerator[list[tuple[int, int, bytes]], None]:
    """The records of ``topic`` as (partition, offset, value), a fetch at a time, partition
    by partition, from ``start`` ((partition, offset); None: the beginning) to the end the
    topic had when each partition was reached. Memory stays at one fetch whatever the
    topic's size. The end is the high watermark from fetch responses: a broker's "latest
    offset" answer is not trusted (Tansu's is wrong). Raises TimeoutError when no record
    arrives for ``stall_timeout_s`` before the end."""
    # One fetch at a time, just big enough for the largest record the broker takes.
    fetch_bytes = settings.kafka_max_message_bytes + 64 * 1024
    # aiokafka's own 500 ms wait, raised while reading old records from a slow broker
    base_wait_ms = min(500, settings.kafka_fetch_lagging_max_wait_ms)
    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        enable_auto_commit=False,
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=fetch_bytes,
        fetch_max_wait_ms=base_wait_ms,
        request_timeout_ms=settings.kafka_request_timeout_ms,
    )
    pacer = FetchPacer(consumer, base_wait_ms, settings.kafka_fetch_lagging_max_wait_ms, "topic-reader")
    partitions = await topic_partitions(settings, topic)
    await consumer.start()
    try:
        first_partition, first_offset = start if start is not None else (0, 0)
        for partition in partitions:
            if partition < first_partition:
                continue
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            if partition == first_partition and first_offset > 0:
                consumer.seek(tp, first_offset)
            else:
                await consumer.seek_to_beginning(tp)
            async with aclosing(_partition_to_its_end(consumer, pacer, tp, stall_timeout_s)) as reading:
                async for records in reading:
                    yield records
    finally:
        await stop_reader(consumer)


async def stop_reader(consumer: AIOKafkaConsumer) -> None:
    """Stop a consumer that read a topic for a request, bounded, never raising: aiokafka's
    stop awaits its own fetch tasks cancelled, and one cancelled while the broker was away
    leaked its CancelledError out of stop (a DLQ listing answered 500 in the soak). The
    request's own answer, or its own error, is what the caller sees."""
    # Let the consumer's own background task begin before stopping it: stopped at once
    # (no partition to read), aiokafka awaits that task cancelled before it ran and raises.
    await asyncio.sleep(0)
    await bounded_step("topic reader", consumer.stop(), CLOSE_S)


async def _partition_to_its_end(
    consumer: AIOKafkaConsumer, pacer: FetchPacer, tp: TopicPartition, stall_timeout_s: float
) -> AsyncGenerator[list[tuple[int, int, bytes]], None]:
    """The assigned partition ``tp``'s records from the consumer's position to the high
    watermark the first fetch reports (fixed once known: a scan never chases new records)."""
    end: int | None = None
    stalled_at = time.monotonic() + stall_timeout_s
    while True:
        fetched = await consumer.getmany(tp, timeout_ms=200)
        await pacer.after_fetch(fetched)
        records = [(r.partition, r.offset, r.value) for r in fetched.get(tp, [])]
        if end is None:
            end = consumer.highwater(tp)
        if end is not None:
            records = [record for record in records if record[1] < end]
        if records:
            stalled_at = time.monotonic() + stall_timeout_s
            yield records
        if end is not None and await consumer.position(tp) >= end:
            return
        if time.monotonic() > stalled_at:
            raise TimeoutError(
                f"could not read {tp.topic} partition {tp.partition} to its end: no record for {stall_timeout_s:g} s"
            )


async def read_at(
    settings: Settings, topic: str, places: Sequence[tuple[int, int]], timeout_s: float = 10.0
) -> list[tuple[int, int, bytes]]:
    """The records at these (partition, offset) places of ``topic``, as (partition,
    offset, value), in the order asked; a place past the end or no longer kept is left
    out. One consumer; each place costs one fetch, whatever the topic's size."""
    if not places:
        return []
    fetch_bytes = settings.kafka_max_message_bytes + 64 * 1024
    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        enable_auto_commit=False,
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=fetch_bytes,
        request_timeout_ms=settings.kafka_request_timeout_ms,
    )
    await consumer.start()
    found: list[tuple[int, int, bytes]] = []
    try:
        deadline = time.monotonic() + timeout_s
        for partition, offset in places:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            while time.monotonic() < deadline:
                fetched = await consumer.getmany(tp, timeout_ms=200, max_records=1)
                records = fetched.get(tp, [])
                if records:
                    if records[0].offset == offset:
                        found.append((partition, offset, records[0].value))
                    break
                end = consumer.highwater(tp)
                if end is not None and offset >= end:
                    break
    finally:
        await stop_reader(consumer)
    return found

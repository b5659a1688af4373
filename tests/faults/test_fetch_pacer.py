"""A consumer catches up on a broker that reads old records slowly: Tansu on S3 storage,
restarted, answers a short fetch with nothing while its read of the next record batch is
still under way. The fetch pacer lengthens the wait while the partition lags and drops
it back once caught up.

How slowly S3 answers is the machine's: on a fast one every read beat the short wait, and
there was nothing to pace. So the broker reaches S3 through a proxy that, once the records
are written, holds every S3 reply back for longer than the short wait."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from brimful.core.fetch_pacer import FetchPacer
from brimful.core.kafka import connection_options, ensure_topics, make_producer
from brimful.stack import EmbeddedStack
from tests.helpers.slow_replies import SlowReplies
from tests.helpers.stacks import s3_broker_env, stack_settings

RECORDS = 60  # each sent alone: one record batch, so one object read from S3, apiece
SHORT_WAIT_MS = 100  # a restarted Tansu on S3 answers fetches this short with nothing...
S3_DELAY_S = 0.25  # ...when S3's replies take this long


@pytest.fixture
def slow_s3(s3_server: str) -> Iterator[SlowReplies]:
    """The local S3 server behind a proxy, answering at its own speed until a delay is set."""
    proxy = SlowReplies(int(s3_server.rsplit(":", 1)[1]))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def s3_broker(tmp_path: Path, slow_s3: SlowReplies) -> Iterator[EmbeddedStack]:
    """Only a broker, its log on the local S3 server, reached through ``slow_s3``."""
    broker = EmbeddedStack(
        stack_settings(topic_partitions=1, kafka_fetch_max_wait_ms=SHORT_WAIT_MS),
        tmp_path,
        broker_storage="s3://tansu/",
        broker_env=s3_broker_env(slow_s3.url),
    )
    try:
        broker.start_broker()
        yield broker
    finally:
        broker.stop()


async def test_a_lagging_consumer_catches_up_on_a_slow_broker_and_its_wait_returns(
    s3_broker: EmbeddedStack, slow_s3: SlowReplies
) -> None:
    settings = s3_broker.settings
    await ensure_topics(settings)
    producer = make_producer(settings)
    await producer.start()
    try:
        for number in range(RECORDS):
            await producer.send_and_wait(settings.requests_topic, str(number).encode())
    finally:
        await producer.stop()
    s3_broker.restart("broker")  # its cache is gone: every record batch is read back from S3
    slow_s3.delay_s = S3_DELAY_S

    consumer = AIOKafkaConsumer(
        **connection_options(settings),
        enable_auto_commit=False,
        fetch_max_wait_ms=SHORT_WAIT_MS,
        request_timeout_ms=settings.kafka_request_timeout_ms,
    )
    await consumer.start()
    try:
        tp = TopicPartition(settings.requests_topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        pacer = FetchPacer(consumer, SHORT_WAIT_MS, settings.kafka_fetch_lagging_max_wait_ms, "test")
        seen: list[int] = []
        longest_wait_ms = pacer.wait_ms
        deadline = time.monotonic() + 90  # at the short wait alone it would never end
        while len(seen) < RECORDS:
            assert time.monotonic() < deadline, f"read {len(seen)} of {RECORDS}; fetch wait {pacer.wait_ms} ms"
            fetched = await consumer.getmany(tp, timeout_ms=1000)
            seen += [int(record.value) for record in fetched.get(tp, [])]
            await pacer.after_fetch(fetched)
            # The wait is the fetcher's own: set_fetch_max_wait still reaches into this aiokafka.
            assert consumer._fetcher._fetch_max_wait_ms == pacer.wait_ms
            longest_wait_ms = max(longest_wait_ms, pacer.wait_ms)
        assert seen == list(range(RECORDS))
        assert longest_wait_ms > SHORT_WAIT_MS  # it was the longer wait that brought them
        # Caught up: the next fetch finds nothing past the position, and the wait is short again.
        await pacer.after_fetch(await consumer.getmany(tp, timeout_ms=1000))
        assert pacer.wait_ms == SHORT_WAIT_MS
    finally:
        await consumer.stop()

"""What Brimful needs of Apache Kafka, on each tested version (``KAFKA_VERSIONS``), with
the broker configured as production configures it: its clients' listener is mutual TLS,
so every connection of the API and the batchers is; and its record limit
(``message.max.bytes``) is below what Brimful was told (``kafka_max_message_bytes``), so
the broker itself refuses what is too large.

- the whole pipeline runs over TLS, and a client without the right certificates is refused;
- a task over the broker's own limit is answered 413 before it is sent (the API reads the
  topics' ``max.message.bytes``: a record the broker refused would put the idempotent
  producer's later sends to its partition out of sequence), and the tasks sent beside it
  are accepted and done; a dead letter the broker refuses (its topic's limit lowered after
  the batchers read it) is written again without its inputs;
- the batchers' committed offsets hold across a whole-broker restart, and records deleted
  below them (DeleteRecords, as retention deletes) change nothing: the batchers resume
  where they were.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from brimful.core.kafka import connection_options, make_producer, topic_partitions
from brimful.core.settings import changed_settings
from brimful.stack import EmbeddedStack
from brimful.stack.kafka_cluster import KafkaTls
from brimful.stack.kafka_jars import KAFKA_VERSIONS
from tests.helpers.certificates import issue_certificates
from tests.helpers.pipeline import committed_offset, expected_outputs, read_dead_letters
from tests.helpers.polling import wait_for
from tests.helpers.stacks import add_second_batchers, stack_settings, start_stack
from tests.helpers.task_client import TaskClient

BROKER_LIMIT = 64 * 1024  # the broker's message.max.bytes
TOLD_LIMIT = 256 * 1024  # what Brimful is told: more than the broker takes
PARTITIONS = 2


@pytest.fixture(scope="module", params=KAFKA_VERSIONS, ids=[f"kafka-{v}" for v in KAFKA_VERSIONS])
def tls_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    certificates = issue_certificates(tmp_path_factory.mktemp("kafka-tls"))
    settings = stack_settings(
        api_workers=2,
        topic_partitions=PARTITIONS,
        kafka_max_message_bytes=TOLD_LIMIT,
        kafka_security_protocol="SSL",
        kafka_ssl_cafile=str(certificates / "ca.crt"),
        kafka_ssl_certfile=str(certificates / "client.crt"),
        kafka_ssl_keyfile=str(certificates / "client.key"),
    )
    running = start_stack(
        tmp_path_factory.mktemp("kafka-contract"),
        settings,
        kafka_version=request.param,
        kafka_tls=KafkaTls(certificates / "ca.crt", certificates / "broker.crt", certificates / "broker.key"),
        kafka_broker_config={"message.max.bytes": BROKER_LIMIT},
    )
    try:
        add_second_batchers(running, [running.settings.default_model])
        yield running
    finally:
        running.stop()


async def _all_done(client: TaskClient, accepted: dict[str, str]) -> None:
    for task_id, text in accepted.items():
        task = await client.wait_final(task_id, timeout_s=60)
        assert task["status"] == "done" and task["outputs"] == expected_outputs(text), task


async def test_every_task_goes_through_mutual_tls_and_a_client_without_it_is_refused(
    tls_stack: EmbeddedStack,
) -> None:
    tag = uuid.uuid4().hex
    async with TaskClient(tls_stack.api_url) as client:
        texts = [f"over tls {tag} {n % 5}" for n in range(20)]  # identical inputs among them
        accepted = dict(zip(await asyncio.gather(*(client.submit({"TEXT": t}) for t in texts)), texts, strict=True))
        await _all_done(client, accepted)
    settings = tls_stack.settings
    for change in (
        {"kafka_ssl_cafile": ""},  # the system's trust store does not know this CA
        {"kafka_ssl_certfile": "", "kafka_ssl_keyfile": ""},  # no client certificate
        {"kafka_security_protocol": "PLAINTEXT"},
    ):
        quick = {"kafka_request_timeout_ms": 5000, "kafka_fetch_lagging_max_wait_ms": 2500}
        producer = make_producer(changed_settings(settings, **quick, **change))
        with pytest.raises(KafkaConnectionError):
            await asyncio.wait_for(producer.start(), timeout=30)
        await producer.stop()


async def test_a_task_over_the_brokers_own_limit_is_413_and_those_beside_it_are_done(
    tls_stack: EmbeddedStack,
) -> None:
    tag = uuid.uuid4().hex
    too_large = {"inputs": {"TEXT": "x" * (BROKER_LIMIT + 4096)}}  # under the told limit, over the broker's
    async with TaskClient(tls_stack.api_url) as client:
        small = [f"beside {tag} {n}" for n in range(30)]
        answers = await asyncio.gather(
            client.request("POST", "/v1/tasks", json=too_large),
            *(client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}}) for text in small),
        )
        status, body = answers[0]
        assert status == 413 and body["error"]["code"] == "payload_too_large", body
        assert str(BROKER_LIMIT - 256) in body["error"]["message"]  # the broker's limit, read from it
        assert all(status == 202 for status, _ in answers[1:]), [a for a in answers[1:] if a[0] != 202][:3]
        await _all_done(client, {body["task_id"]: text for (_, body), text in zip(answers[1:], small, strict=True)})


async def test_a_dead_letter_the_broker_refuses_is_written_without_its_inputs(tls_stack: EmbeddedStack) -> None:
    # The DLQ topic's limit is lowered after the batchers read it: the task's record fits
    # its own topic, its dead letter no longer fits the DLQ's, and the broker refuses it.
    settings = tls_stack.settings
    text = "!fail " + "y" * 24_000
    await _set_topic_limit(tls_stack, settings.dlq_topic, 16 * 1024)
    try:
        await _fail_one_too_large_for_the_dlq(tls_stack, text)
    finally:
        await _set_topic_limit(tls_stack, settings.dlq_topic, BROKER_LIMIT)


async def _set_topic_limit(stack: EmbeddedStack, topic: str, limit: int) -> None:
    admin = AIOKafkaAdminClient(**connection_options(stack.settings))
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})])
    finally:
        await admin.close()


async def _fail_one_too_large_for_the_dlq(tls_stack: EmbeddedStack, text: str) -> None:
    async with TaskClient(tls_stack.api_url) as client:
        task_id = await client.submit({"TEXT": text})
        task = await client.wait_final(task_id, timeout_s=60)
        assert task["status"] == "failed" and "!fail" in task["error"]["message"], task
        (letter,) = [x for x in await read_dead_letters(tls_stack) if x.request.task_id == task_id]
        assert not letter.request.inputs and not letter.raw_request
        assert "refused by the broker as too large" in letter.error_message and "!fail" in letter.error_message
        after = await client.wait_final(await client.submit({"TEXT": f"moved on {uuid.uuid4().hex}"}), timeout_s=60)
        assert after["status"] == "done"


async def _committed(stack: EmbeddedStack) -> dict[int, int]:
    return {p: await committed_offset(stack.settings, p) for p in range(PARTITIONS)}


async def _ends(stack: EmbeddedStack) -> dict[int, int]:
    settings = stack.settings
    consumer = AIOKafkaConsumer(**connection_options(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(settings.requests_topic, p) for p in range(PARTITIONS)]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(parts)).items()}
    finally:
        await consumer.stop()


async def test_committed_offsets_hold_across_a_broker_restart_and_records_deleted_below_them(
    tls_stack: EmbeddedStack,
) -> None:
    settings = tls_stack.settings
    assert await topic_partitions(settings, settings.requests_topic) == list(range(PARTITIONS))
    tag = uuid.uuid4().hex
    async with TaskClient(tls_stack.api_url) as client:
        first = {await client.submit({"TEXT": f"before {tag} {n}"}): f"before {tag} {n}" for n in range(40)}
        await _all_done(client, first)

        async def caught_up() -> bool:
            return await _committed(tls_stack) == await _ends(tls_stack)

        await wait_for(caught_up, 30, "the batchers to commit every record")
        committed = await _committed(tls_stack)
        batchers = [name for name in tls_stack.processes if name.startswith("batcher")]
        loop = asyncio.get_running_loop()
        for name in batchers:
            await loop.run_in_executor(None, tls_stack.processes[name].stop)
        admin = AIOKafkaAdminClient(**connection_options(settings))
        await admin.start()
        try:
            deleted = await admin.delete_records(
                {TopicPartition(settings.requests_topic, p): RecordsToDelete(o) for p, o in committed.items()}
            )
        finally:
            await admin.close()
        assert {tp.partition: low for tp, low in deleted.items()} == committed  # nothing left below them
        await loop.run_in_executor(None, tls_stack.restart, "broker")

        async def kept() -> bool:  # the group's coordinator may still be loading its offsets
            return await _committed(tls_stack) == committed

        await wait_for(kept, 30, "the committed offsets, kept by the broker across its restart")
        second = {await client.submit({"TEXT": f"after {tag} {n}"}): f"after {tag} {n}" for n in range(40)}
        for name in batchers:
            await loop.run_in_executor(None, tls_stack.start_batcher, name)
        await _all_done(client, second)
        await _all_done(client, first)  # what was done stays done
        await wait_for(caught_up, 30, "the batchers to commit the new records")
        assert sum((await _committed(tls_stack)).values()) == sum(committed.values()) + len(second)

"""No task or partition is stranded: records the batcher cannot decode, tasks and dead
letters larger than the broker accepts, a failing trace recorder, and a model outage
longer than the give-up time (real broker, Redis and Triton on a stack of their own)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.model_catalogue import TensorSpec, encode_input
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.pipeline import expected_outputs, read_dead_letters
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient

BROKER_LIMIT = 16 * 1024  # the broker's message limit this stack is told of
RECORD_LIMIT = BROKER_LIMIT - 256  # what a task's record may take (room for the batch's framing)


@pytest.fixture(scope="module")
def lean_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    workdir = tmp_path_factory.mktemp("lean-stack")
    (workdir / "a-file").write_text("traces cannot go under a file\n")
    settings = stack_settings(
        kafka_max_message_bytes=BROKER_LIMIT,
        transient_give_up_s=2.0,
        breaker_max_open_s=0.5,
        infer_timeout_s=2.0,
        trace_dir=str(workdir / "a-file" / "traces"),
    )
    running = start_stack(workdir, settings)
    yield running
    running.stop()


@pytest.fixture
async def lean_client(lean_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(lean_stack.api_url) as client:
        yield client


async def test_records_the_batcher_cannot_decode_go_to_the_dlq_and_the_partition_moves_on(
    lean_stack: EmbeddedStack, lean_client: TaskClient
) -> None:
    settings = lean_stack.settings
    redis = Redis.from_url(settings.redis_url)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
    good = TaskRequest(task_id=uuid.uuid4().hex, model=settings.model_name, submitted_at_ms=now_ms())
    good.inputs["TEXT"].CopyFrom(encode_input(TensorSpec("TEXT", "BYTES", (1,)), "after the bad records"))
    await store.create_queued(good.task_id, good.submitted_at_ms)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=50)
    await producer.start()
    try:
        # Sent together, so the batcher fetches the good record while the bad ones' dead
        # letters are being written.
        sends = [
            await producer.send(settings.requests_topic, value=None, key=b"no-value"),
            await producer.send(settings.requests_topic, value=b"\xff\xfe not protobuf", key=b"garbage"),
            await producer.send(settings.requests_topic, value=good.SerializeToString(), key=good.task_id.encode()),
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
        await redis.aclose()
    task = await lean_client.wait_final(good.task_id, timeout_s=10)
    assert task["status"] == "done" and task["outputs"] == expected_outputs("after the bad records")
    letters = {letter.request.task_id: letter for letter in await read_dead_letters(lean_stack)}
    assert letters["no-value"].error_class == "undecodable" and letters["no-value"].raw_request == b""
    assert letters["garbage"].error_class == "undecodable" and letters["garbage"].raw_request.startswith(b"\xff\xfe")
    assert lean_stack.processes["batcher-0"].running()


async def test_a_task_larger_than_the_broker_accepts_is_413_and_never_503(lean_client: TaskClient) -> None:
    too_large = {"inputs": {"TEXT": "x" * (RECORD_LIMIT + 100)}}
    status, body = await lean_client.request("POST", "/v1/tasks", json=too_large)
    assert status == 413 and body["error"]["code"] == "payload_too_large", body
    assert "broker" in body["error"]["message"] and str(RECORD_LIMIT) in body["error"]["message"]
    status, body = await lean_client.request(
        "POST", "/v1/tasks:batch", json={"tasks": [{"inputs": {"TEXT": "fits"}}, too_large]}
    )
    assert status == 200 and "task_id" in body["results"][0], body
    assert body["results"][1]["error"]["code"] == "payload_too_large"


async def test_a_dead_letter_too_large_for_the_broker_is_written_without_the_inputs(
    lean_stack: EmbeddedStack, lean_client: TaskClient
) -> None:
    # The record fits the broker; its dead letter (the record, the error, the attempts) would not.
    text = "!fail " + "y" * 15_900
    status, body = await lean_client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}})
    assert status == 202, body
    task = await lean_client.wait_final(body["task_id"], timeout_s=30)
    assert task["status"] == "failed" and "!fail" in task["error"]["message"]
    (letter,) = [x for x in await read_dead_letters(lean_stack) if x.request.task_id == body["task_id"]]
    assert not letter.request.inputs and "dropped" in letter.error_message and "!fail" in letter.error_message
    after = await lean_client.wait_final(await lean_client.submit({"TEXT": "the partition moved on"}), timeout_s=30)
    assert after["status"] == "done"


async def test_a_failing_trace_recorder_stops_neither_tuning_nor_the_status_board(
    lean_stack: EmbeddedStack, lean_client: TaskClient
) -> None:
    log = lean_stack.workdir / "logs" / "batcher-0.log"
    deadline = time.monotonic() + 20
    while "could not write the arrival trace" not in log.read_text():
        assert time.monotonic() < deadline, "the batcher never tried to write its trace"
        await lean_client.submit({"TEXT": "an arrival to record"})
        await asyncio.sleep(0.5)  # the recorder flushes every 5 s; nothing to wait on but the log
    await tune_live(lean_client, max_wait_ms=123)
    assert [b["params"]["max_wait"] for b in (await lean_client.stats())["batchers"]] == [0.123]


async def test_after_an_outage_longer_than_the_give_up_time_the_batcher_recovers_by_itself(
    lean_stack: EmbeddedStack, lean_client: TaskClient
) -> None:
    lean_stack.processes["triton"].kill()
    lost = await lean_client.wait_final(await lean_client.submit({"TEXT": "during the outage"}), timeout_s=30)
    assert lost["status"] == "failed" and lost["error"]["class"] == "unavailable"  # given up after 2 s
    await asyncio.to_thread(lean_stack.start_model_host)
    # Every batch failed to the DLQ, so no call is left to probe the model: the batcher must.
    task = await lean_client.wait_final(await lean_client.submit({"TEXT": "after the outage"}), timeout_s=30)
    assert task["status"] == "done" and task["outputs"] == expected_outputs("after the outage")

"""The whole pipeline against a real broker, Redis and Triton."""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from brimful.core.kafka import topic_partitions
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.metrics import triton_counts
from tests.helpers.pipeline import committed_offset, expected_outputs, random_text, read_dead_letters
from tests.helpers.polling import wait_for
from tests.helpers.task_client import TaskClient


async def test_burst_of_2000_all_done_with_their_own_results_in_full_batches(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    # The cost mode: a latency target as long as max_wait, so batches wait to fill (at
    # the default target the batch leaves when its oldest row would miss 50 ms). A
    # max_wait of 2 s, so a slow moment of the one API process sending the burst cannot
    # time a batch out before it fills.
    await tune_live(client, max_wait_ms=2000, latency_target_ms=2000)
    rng = random.Random(2000)
    texts = [random_text(rng) for _ in range(2000)]
    texts[:3] = ["", "a", "🙂" * 1024]  # the edges: empty, one byte, exactly 4 KB of emoji
    before = await client.stats()
    success_before, fail_before = await triton_counts(stack, stack.settings.model_name)

    task_ids = await asyncio.gather(*(client.submit({"TEXT": text}) for text in texts))
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=120, interval_s=0.25) for t in task_ids))

    for text, task_id, result in zip(texts, task_ids, results):
        assert result["task_id"] == task_id
        assert result["status"] == "done", result
        assert result["outputs"] == expected_outputs(text)

    after = await client.stats()
    batches = after["batches_dispatched"] - before["batches_dispatched"]
    rows = after["rows_dispatched"] - before["rows_dispatched"]
    # Every task was a row of a call, or an identical task's result (an edge text another
    # test sent before, or a repeat among the random ones).
    assert rows + after["cache_hits"] - before["cache_hits"] == 2000
    assert after["padded_slots"] - before["padded_slots"] == batches * 64 - rows
    # Triton accepted every call Brimful made, and the model refuses any call that is
    # not exactly 64 rows (test_reference_model proves that refusal).
    success_after, fail_after = await triton_counts(stack, stack.settings.model_name)
    assert success_after - success_before == batches
    assert fail_after - fail_before == 0
    print(f"\nburst: {rows} rows in {batches} batches, {rows / batches:.1f} rows per batch")
    assert rows / batches >= 56, f"{rows} rows in {batches} batches"


async def test_trickle_is_never_held_for_a_batch_that_will_not_fill(stack: EmbeddedStack, client: TaskClient) -> None:
    max_wait_ms = stack.settings.max_wait_ms
    latencies_ms = []
    for index in range(15):
        sent = time.monotonic()
        task_id = await client.submit({"TEXT": f"trickle {index}"})
        task = await client.wait_final(task_id, timeout_s=10, interval_s=0.005)
        assert task["status"] == "done"
        assert task["outputs"] == expected_outputs(f"trickle {index}")
        latencies_ms.append(task["updated_at_ms"] - task["submitted_at_ms"])
        # one request every 200 ms, measured from the previous send
        await asyncio.sleep(max(0.0, 0.2 - (time.monotonic() - sent)))
    assert max(latencies_ms) <= max_wait_ms + 100, latencies_ms
    # Flushed on the short deadline, not held until the upper bound.
    assert statistics.median(latencies_ms) < max_wait_ms / 2, latencies_ms


async def test_failing_request_ends_failed_with_its_error_and_in_the_dlq(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    task_id = await client.submit({"TEXT": "!fail on purpose"})
    task = await client.wait_final(task_id, timeout_s=30)

    assert task["status"] == "failed"
    assert "outputs" not in task
    assert task["error"]["class"] == "model_error"
    assert "!fail" in task["error"]["message"]
    assert task["error"]["attempts"] == stack.settings.max_attempts

    letters = [letter for letter in await read_dead_letters(stack) if letter.request.task_id == task_id]
    assert len(letters) == 1
    letter = letters[0]
    assert letter.error_class == "model_error"
    assert "!fail" in letter.error_message
    assert len(letter.attempts) == stack.settings.max_attempts
    assert letter.request.inputs["TEXT"].bytes_contents == [b"!fail on purpose"]
    assert letter.batch_id == task["error"]["batch_id"]
    assert task_id in letter.batch_task_ids
    assert letter.model == stack.settings.model_name


async def test_redelivered_request_does_not_produce_a_second_result(stack: EmbeddedStack, client: TaskClient) -> None:
    settings = stack.settings
    task_id = await client.submit({"TEXT": "original"})
    first = await client.wait_final(task_id)
    assert first["outputs"] == expected_outputs("original")
    before = await client.stats()

    # Deliver the same task again, as a redelivery after a crash would, but with other
    # input bytes: a second model call would be visible as a changed result.
    replay = TaskRequest(task_id=task_id, model=settings.model_name, submitted_at_ms=first["submitted_at_ms"])
    replay.inputs["TEXT"].datatype = "BYTES"
    replay.inputs["TEXT"].shape.append(1)
    replay.inputs["TEXT"].bytes_contents.append(b"tampered")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        metadata = await producer.send_and_wait(
            settings.requests_topic, replay.SerializeToString(), key=task_id.encode()
        )
    finally:
        await producer.stop()

    async def committed_past() -> bool:
        return await committed_offset(stack.settings, metadata.partition) > metadata.offset

    await wait_for(committed_past, 20, "the batcher to commit past the redelivered request")

    again = await client.get(task_id)
    assert again["status"] == "done"
    assert again["outputs"] == first["outputs"]
    after = await client.stats()
    assert after["rows_dispatched"] == before["rows_dispatched"], "the redelivered task reached the model"


async def test_readyz_reports_every_dependency(client: TaskClient) -> None:
    status, body = await client.request("GET", "/readyz")
    assert status == 200
    assert body == {
        "ready": True,
        "checks": {"broker": True, "redis": True, "model_signature": True, "model": True},
        "required": ["broker", "redis", "model_signature"],
    }


async def test_committed_offsets_only_move_forward_to_finished_work(stack: EmbeddedStack, client: TaskClient) -> None:
    # After traffic settles, every partition's committed offset equals its log end:
    # nothing finished is left uncommitted, nothing unfinished is committed past.
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"settle {i}"}) for i in range(50)))
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    settings = stack.settings
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [
            TopicPartition(settings.requests_topic, p)
            for p in await topic_partitions(settings, settings.requests_topic)
        ]
        assert partitions
        consumer.assign(partitions)
        # The log end is the high watermark a fetch reports (Tansu answers ListOffsets
        # "latest" wrongly, so seek_to_end and end_offsets cannot be trusted).
        deadline = time.monotonic() + 10
        while any(consumer.highwater(tp) is None for tp in partitions):
            assert time.monotonic() < deadline, "no fetch response carried a high watermark"
            await consumer.getmany(timeout_ms=200)
        ends = {tp.partition: int(consumer.highwater(tp)) for tp in partitions}  # type: ignore[arg-type]
    finally:
        await consumer.stop()
    deadline = time.monotonic() + 10
    for partition, end in ends.items():
        while (committed := await committed_offset(stack.settings, partition)) != end:
            assert committed <= end
            assert time.monotonic() < deadline, f"partition {partition}: committed {committed}, end {end}"
            await asyncio.sleep(0.1)

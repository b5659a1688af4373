"""A row that does not fit the model's signature (a record checked against another version
of the model: a replayed dead letter, an older API, a model changed under a backlog) fails
alone, with its own dead letter, before it is stacked with its neighbours; the other rows
of its batch are computed."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from brimful.core.clock import now_ms
from brimful.core.kafka import make_producer
from brimful.core.redis_keys import RedisKeys
from brimful.core.task_record import NewTask
from brimful.core.task_store import TaskStore
from brimful.schemas import InputTensor, TaskRequest
from brimful.stack import EmbeddedStack
from tests.helpers.live_policy import tune_live
from tests.helpers.pipeline import expected_outputs
from tests.helpers.task_client import TaskClient


def request(task_id: str, tenant: str, text: str | None) -> TaskRequest:
    """A task for the reference model; ``text`` None: its TEXT as FP32, as another
    signature of the model would have it."""
    message = TaskRequest(task_id=task_id, model=stack_model, submitted_at_ms=now_ms(), tenant=tenant)
    if text is None:
        message.inputs["TEXT"].CopyFrom(InputTensor(datatype="FP32", shape=[1], raw_contents=b"\x00\x00\x80?"))
    else:
        message.inputs["TEXT"].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[text.encode()]))
    return message


stack_model = "brimful_reference"


async def test_a_row_that_does_not_fit_the_signature_fails_alone(
    stack: EmbeddedStack, client: TaskClient, restore_policy: None
) -> None:
    await tune_live(client, min_wait_ms=1000, max_wait_ms=2000, latency_target_ms=2000)  # one batch for them all
    settings = stack.settings
    tag = uuid.uuid4().hex
    texts = {uuid.uuid4().hex: ("", f"fits {tag} {n}") for n in range(9)}  # the open stack's tenant
    unfit = uuid.uuid4().hex
    redis = Redis.from_url(settings.redis_url)
    store = TaskStore(redis, RedisKeys(settings.key_prefix), settings.result_ttl_s)
    producer = make_producer(settings)
    await producer.start()
    try:
        everyone = {**texts, unfit: ("", None)}
        outcomes = await store.create_queued_many(
            [NewTask(t, now_ms(), tenant, 0, stack_model) for t, (tenant, _) in everyone.items()]
        )
        assert outcomes == [None] * len(everyone)
        sends = [
            await producer.send(
                settings.requests_topic,
                request(task_id, tenant, text).SerializeToString(),
                key=task_id.encode(),
                partition=0,
            )
            for task_id, (tenant, text) in everyone.items()
        ]
        for sent in sends:
            await sent
    finally:
        await producer.stop()
        await redis.aclose()
    for task_id, (_, text) in texts.items():
        answer = await client.wait_final(task_id)
        assert answer["status"] == "done" and answer["outputs"] == expected_outputs(text), answer  # type: ignore[arg-type]
    failed = await client.wait_final(unfit)
    assert failed["status"] == "failed" and failed["error"]["class"] == "rejected", failed
    assert "FP32" in failed["error"]["message"] and "BYTES" in failed["error"]["message"]
    status, letters = await client.request("GET", f"/v1/admin/dlq?ids={unfit}")
    assert status == 200 and [e["task_id"] for e in letters["entries"]] == [unfit], letters

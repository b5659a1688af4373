"""A poison row among good ones: the batch is split until it is alone; the rest complete.
And one tenant's failing rows cost only that tenant's budget of calls."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from brimful.batcher.main import model_pool
from brimful.core.clock import now_ms
from brimful.core.model_catalogue import encode_input
from brimful.core.redis_keys import RedisKeys
from brimful.core.stats import SharedStats
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.stack import EmbeddedStack
from brimful.workers.batch import Batch, BatchItem
from brimful.workers.batch_runner import BatchRunner
from brimful.workers.dead_letters import DeadLetterWriter
from brimful.workers.isolation_budget import IsolationBudget
from brimful.workers.retry_policy import BatchRetryPolicy
from tests.helpers.pipeline import expected_outputs, read_dead_letters


@asynccontextmanager
async def runner_and_batch(
    stack: EmbeddedStack, rows: list[tuple[str, str]], isolation: IsolationBudget | None = None
) -> AsyncIterator[tuple[BatchRunner, TaskStore, Batch]]:
    """A runner on the stack's real Triton, Redis and broker, and one batch of ``rows``
    ((tenant, text) each), recorded as queued tasks."""
    settings = stack.settings
    redis = Redis.from_url(settings.redis_url)
    keys = RedisKeys(settings.key_prefix)
    pool = model_pool(settings, redis, keys)
    await pool.refresh()
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        signature = await pool.any_model().signature()
        store = TaskStore(redis, keys, ttl_s=600)
        items = []
        for offset, (tenant, text) in enumerate(rows):
            task_id = uuid.uuid4().hex
            request = TaskRequest(task_id=task_id, model=signature.name, submitted_at_ms=now_ms(), tenant=tenant)
            request.inputs["TEXT"].CopyFrom(encode_input(signature.inputs[0], text))
            await store.create_queued(task_id, request.submitted_at_ms, tenant)
            items.append(BatchItem(request, partition=0, offset=offset))
        runner = BatchRunner(
            pool,
            signature,
            store,
            SharedStats(redis, keys),
            DeadLetterWriter(producer, settings.dlq_topic, settings.kafka_max_message_bytes),
            BatchRetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02),
            isolation=isolation,
        )
        yield runner, store, Batch(uuid.uuid4().hex, 0, items, "full")
    finally:
        await producer.stop()
        await pool.close()
        await redis.aclose()


async def test_one_failing_row_among_63_good_ones(stack: EmbeddedStack) -> None:
    texts = [f"good row {i} ✓" for i in range(64)]
    texts[37] = "!fail the poison row"
    async with runner_and_batch(stack, [("", text) for text in texts]) as (runner, store, batch):
        outcome = await runner.run(batch)

        assert outcome.done == 63 and outcome.failed == 1
        # 1 full call, then two halves at each of 6 levels (32, 16, 8, 4, 2, 1 rows),
        # then 2 more tries of the poison row alone: 14 calls beyond the first.
        assert outcome.isolation_calls == 12 + 2
        assert outcome.calls == 1 + 12 + 2
        for item, text in zip(batch.items, texts):
            record = await store.get(item.task_id)
            assert record is not None
            if text.startswith("!fail"):
                assert record.status == "failed" and "!fail" in record.error["message"]  # type: ignore[index]
            else:
                assert record.status == "done" and record.outputs == expected_outputs(text)
        poison = batch.items[37].task_id
        letters = [letter for letter in await read_dead_letters(stack) if letter.request.task_id == poison]
        assert len(letters) == 1
        assert letters[0].error_class == "model_error"
        assert len(letters[0].attempts) == 1 + 6 + 2  # every call that carried the poison row
        assert len(letters[0].batch_task_ids) == 64


async def test_a_tenant_that_only_sends_failing_rows_is_bounded_and_costs_others_nothing(stack: EmbeddedStack) -> None:
    """32 always-failing rows of one tenant among 32 good rows of another: the good rows
    are done after one more call, and the failing tenant's isolation stops at its budget."""
    rows = [("mallory", f"!fail {i}") if i % 2 else ("alice", f"alice {i}") for i in range(64)]
    budget = IsolationBudget(calls_per_s=0.001, burst=10)
    async with runner_and_batch(stack, rows, budget) as (runner, store, batch):
        outcome = await runner.run(batch)

        # the mixed call, alice's rows together, then mallory's ten budgeted calls
        assert outcome.calls == 1 + 1 + 10
        assert outcome.done == 32 and outcome.failed == 32
        budget_spent = 0
        for item, (tenant, text) in zip(batch.items, rows):
            record = await store.get(item.task_id)
            assert record is not None
            if tenant == "alice":
                assert record.status == "done" and record.outputs == expected_outputs(text)
            else:
                assert record.status == "failed"
                budget_spent += "spent its budget" in record.error["message"]  # type: ignore[index]
        assert budget_spent >= 16  # most of mallory's rows were failed by the bound, not by a call
        letters = {letter.request.task_id for letter in await read_dead_letters(stack)}
        assert {item.task_id for item, (tenant, _) in zip(batch.items, rows) if tenant == "mallory"} <= letters

"""Kafka is the source of truth: a task whose Redis record is lost before its batch runs
(Redis restarted empty, a lost second of AOF, a failover to a lagging replica) is
re-created from its Kafka record and computed, and frees its tenant's quota; a task
cancelled or withdrawn stays so, whatever Redis lost, by its tombstone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from brimful.core.redis_keys import RedisKeys
from brimful.model_server.reference_model import hang_file_at
from brimful.stack import EmbeddedStack
from brimful.stack.metrics_page import read_sample_sums
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import rows_seen_by_model, stack_settings, start_stack, start_wide_stack
from tests.helpers.task_client import TaskClient


@pytest.fixture(scope="module")
def wide_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_wide_stack(tmp_path_factory.mktemp("lost-records"))
    yield running
    running.stop()


async def test_tasks_whose_records_redis_lost_are_computed_from_kafka_and_cancelled_ones_are_not(
    wide_stack: EmbeddedStack,
) -> None:
    keys = RedisKeys(wide_stack.settings.key_prefix)
    tag = uuid.uuid4().hex
    # Ten texts, each twice: identical tasks go through the shared-row path too.
    texts = [f"lost record {tag} {n % 10}" for n in range(20)]
    cancelled_text = f"cancelled, then lost {tag}"
    batcher = wide_stack.processes["batcher-0"]
    batcher.stop()  # the tasks wait in Kafka while their records go
    redis = Redis.from_url(wide_stack.settings.redis_url)
    try:
        async with TaskClient(wide_stack.api_url) as client:
            task_ids = [await client.submit({"TEXT": text}) for text in texts]
            cancelled = await client.submit({"TEXT": cancelled_text})
            status, body = await client.request("DELETE", f"/v1/tasks/{cancelled}")
            assert status == 200 and body["status"] == "cancelled", body
            tenants_in_flight = await redis.zrange(keys.in_flight(""), 0, -1)
            assert {t.encode() for t in task_ids} <= set(tenants_in_flight)
            assert await redis.delete(*(keys.task(t) for t in [*task_ids, cancelled])) == 21

            wide_stack.start_batcher("batcher-0")

            async def all_final() -> bool:  # 404 until the batcher brings a task back
                answers = [await client.request("GET", f"/v1/tasks/{task_id}") for task_id in task_ids]
                return all(code == 200 and body["status"] in ("done", "failed") for code, body in answers)

            await wait_for(all_final, 60, "the tasks whose records were lost to finish")
            answers = [await client.get(task_id) for task_id in task_ids]
            assert [a["status"] for a in answers] == ["done"] * 20, answers
            assert [a["outputs"] for a in answers] == [expected_outputs(text) for text in texts]
            # Every other task of the batcher after them is final too, so theirs have run.
            later = await client.submit({"TEXT": f"after the lost ones {tag}"})
            await client.wait_final(later)
            status, _ = await client.request("GET", f"/v1/tasks/{cancelled}")
            assert status == 404
        assert cancelled_text not in rows_seen_by_model(wide_stack)
        # Their tenant's quota is free again.
        assert not {t.encode() for t in task_ids} & set(await redis.zrange(keys.in_flight(""), 0, -1))
    finally:
        await redis.aclose()
    samples = read_sample_sums(f"http://127.0.0.1:{wide_stack.settings.batcher_metrics_port}/metrics")
    assert samples.get("brimful_tasks_recreated_total") == 20


@pytest.fixture(scope="module")
def hanging_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """Two partitions, one model endpoint whose calls hang while its hang file exists."""
    workdir = tmp_path_factory.mktemp("lost-at-the-model")
    running = start_stack(
        workdir,
        stack_settings(topic_partitions=2),
        model_host_args=(
            "--seen-log",
            str(workdir / "model-seen.log"),
            "--hang-file",
            str(workdir / "hang-{grpc_port}"),
        ),
    )
    yield running
    running.stop()


async def test_tasks_whose_records_redis_lost_while_their_batch_was_at_the_model_are_stored(
    hanging_stack: EmbeddedStack,
) -> None:
    """The record of a running task can go too (a Redis restart without persistence, the
    last second of AOF): the store step writes it again from the Kafka record, as dispatch
    does, and stores the result. Identical inputs among them."""
    keys = RedisKeys(hanging_stack.settings.key_prefix)
    tag = uuid.uuid4().hex
    texts = [f"lost at the model {tag} {n % 10}" for n in range(20)]
    hang = hang_file_at(
        hanging_stack.workdir / "hang-{grpc_port}", next(iter(hanging_stack.model_host_ports.values()))[0]
    )
    redis = Redis.from_url(hanging_stack.settings.redis_url)
    try:
        async with TaskClient(hanging_stack.api_url) as client:
            hang.touch()
            try:
                task_ids = [await client.submit({"TEXT": text}) for text in texts]

                running: list[str] = []

                async def some_at_the_model() -> bool:
                    answers = [await client.get(task_id) for task_id in task_ids]
                    running[:] = [t for t, answer in zip(task_ids, answers) if answer["status"] == "running"]
                    return bool(running)

                # One endpoint of one slot: the first batch hangs at the model, the rest queue.
                await wait_for(some_at_the_model, 30, "a batch at the model")
                assert await redis.delete(*(keys.task(t) for t in task_ids)) == 20
            finally:
                hang.unlink()

            async def all_final() -> bool:
                answers = [await client.request("GET", f"/v1/tasks/{task_id}") for task_id in task_ids]
                return all(code == 200 and body["status"] in ("done", "failed") for code, body in answers)

            await wait_for(all_final, 60, "the tasks whose records were lost at the model to finish")
            answers = [await client.get(task_id) for task_id in task_ids]
            assert [a["status"] for a in answers] == ["done"] * 20, answers
            assert [a["outputs"] for a in answers] == [expected_outputs(text) for text in texts]
        assert not {t.encode() for t in task_ids} & set(await redis.zrange(keys.in_flight(""), 0, -1))
    finally:
        await redis.aclose()

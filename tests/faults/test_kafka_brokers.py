"""Apache Kafka under Brimful, each tested version (``KAFKA_VERSIONS``) as production runs
it: three KRaft nodes, replication factor 3, ``min.insync.replicas`` 2, the idempotent
producer, and the production shape on top (two API workers, two batchers sharing four
partitions, identical inputs among the tasks). Its nodes are killed under load: the
leader of a partition the tasks go to, the active controller, and the whole cluster
restarted. Every task accepted (202) ends done with the right outputs; a submission the
API could not confirm is answered 503, never accepted and lost.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.cluster import ClusterMetadata

from brimful.stack import EmbeddedStack
from brimful.stack.kafka_jars import KAFKA_VERSIONS
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import add_second_batchers, stack_settings, start_stack
from tests.helpers.task_client import TaskClient

PARTITIONS = 4
SUBMITTERS = 6


@pytest.fixture(scope="module", params=KAFKA_VERSIONS, ids=[f"kafka-{v}" for v in KAFKA_VERSIONS])
def kafka_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("kafka-stack"),
        stack_settings(api_workers=2, topic_partitions=PARTITIONS, topic_replication=3),
        kafka_version=request.param,
        kafka_nodes=3,
    )
    try:
        add_second_batchers(running, [running.settings.default_model])
        yield running
    finally:
        running.stop()


async def _node_leading(stack: EmbeddedStack, partition: int) -> int:
    """The node that leads ``partition`` of the requests topic now."""
    topic = stack.settings.topic_generations_for(stack.settings.default_model).topic_at(time.time())
    cluster = await _metadata(stack)
    leader = cluster.leader_for_partition(TopicPartition(topic, partition))
    assert leader is not None and leader >= 0, f"no leader for {topic}/{partition}"
    return int(leader)


async def _metadata(stack: EmbeddedStack) -> ClusterMetadata:
    client = AIOKafkaClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await client.bootstrap()
    try:
        return await client.fetch_all_metadata()
    finally:
        await client.close()


class Flood:
    """Submits tasks from several clients until stopped, keeping what each answer was."""

    def __init__(self, client: TaskClient, tag: str) -> None:
        self.client = client
        self.tag = tag
        self.accepted: dict[str, str] = {}  # task_id -> text
        self.refused = 0
        self._running = True

    async def run(self) -> None:
        await asyncio.gather(*(self._submitter(n) for n in range(SUBMITTERS)))

    def stop(self) -> None:
        self._running = False

    async def _submitter(self, number: int) -> None:
        sent = 0
        while self._running:
            text = f"kafka {self.tag} {(number * 1000 + sent) % 97}"  # identical inputs among them
            sent += 1
            status, body = await self.client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}})
            assert status in (202, 503), (status, body)  # accepted, or refused for now: never a 500
            if status == 202:
                self.accepted[str(body["task_id"])] = text
            else:
                self.refused += 1
                await asyncio.sleep(0.05)


async def _all_done(client: TaskClient, accepted: dict[str, str], timeout_s: float) -> None:
    async def final() -> bool:
        answers = await asyncio.gather(*(client.get(task_id) for task_id in accepted))
        return all(answer["status"] in ("done", "failed") for answer in answers)

    await wait_for(final, timeout_s, "every accepted task to finish", interval_s=0.5)
    answers: list[dict[str, Any]] = await asyncio.gather(*(client.get(task_id) for task_id in accepted))
    wrong = [
        (task_id, answer)
        for (task_id, text), answer in zip(accepted.items(), answers, strict=True)
        if answer["status"] != "done" or answer["outputs"] != expected_outputs(text)
    ]
    assert not wrong, wrong[:3]


async def _kill_under_load(stack: EmbeddedStack, node_id: int) -> Flood:
    """Tasks flood in; node ``node_id`` is killed, stays down a while, and comes back."""
    assert stack.kafka is not None
    loop = asyncio.get_running_loop()
    async with TaskClient(stack.api_url) as client:
        flood = Flood(client, uuid.uuid4().hex)
        flooding = asyncio.create_task(flood.run())
        await wait_for(lambda: len(flood.accepted) >= 100, 30, "tasks accepted before the kill")
        killed = stack.kafka.node(node_id).process
        stack.kafka.kill_node(node_id)
        assert killed is not None and killed.pid not in stack.group_leaders("broker")  # what benchmarks count
        before = len(flood.accepted)
        # Leadership moves within the broker session timeout (3 s): tasks are accepted again.
        await wait_for(lambda: len(flood.accepted) >= before + 100, 60, "tasks accepted with the node down")
        await loop.run_in_executor(None, stack.kafka.start_node, node_id)
        await loop.run_in_executor(None, stack.kafka.wait_ready)
        flood.stop()
        await flooding
        await _all_done(client, flood.accepted, 120)
    return flood


async def test_tasks_accepted_through_a_partition_leaders_kill_all_end_done(kafka_stack: EmbeddedStack) -> None:
    leader = await _node_leading(kafka_stack, 0)
    flood = await _kill_under_load(kafka_stack, leader)
    assert len(flood.accepted) >= 200


async def test_tasks_accepted_through_the_active_controllers_kill_all_end_done(kafka_stack: EmbeddedStack) -> None:
    assert kafka_stack.kafka is not None
    controller = await asyncio.to_thread(kafka_stack.kafka.active_controller)
    flood = await _kill_under_load(kafka_stack, controller)
    assert len(flood.accepted) >= 200


async def test_tasks_accepted_before_a_whole_cluster_restart_all_end_done(kafka_stack: EmbeddedStack) -> None:
    # Accepted with the batchers stopped, so they wait as records in the broker; the whole
    # cluster restarts; the batchers then start and find every record and their offsets.
    batchers = [name for name in kafka_stack.processes if name.startswith("batcher")]
    loop = asyncio.get_running_loop()
    async with TaskClient(kafka_stack.api_url) as client:
        for name in batchers:
            kafka_stack.processes[name].stop()
        tag = uuid.uuid4().hex
        accepted = {}
        for n in range(150):
            text = f"restart {tag} {n % 50}"
            accepted[await client.submit({"TEXT": text})] = text
        await loop.run_in_executor(None, kafka_stack.restart, "broker")
        for name in batchers:
            await loop.run_in_executor(None, kafka_stack.start_batcher, name)
        await _all_done(client, accepted, 120)

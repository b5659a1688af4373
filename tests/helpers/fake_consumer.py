"""The few calls a batcher makes of its Kafka consumer, recorded, and records to feed it:
for unit tests of the batcher's control flow."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from brimful.schemas import TaskRequest

TOPIC = "requests"


class FakeConsumer:
    """What the shutdown path asks of the Kafka consumer: commits, recorded."""

    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, Any]] = []

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append(offsets)

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    def pause(self, *tps: TopicPartition) -> None:
        pass


def record_at(offset: int) -> ConsumerRecord:  # type: ignore[type-arg]
    request = TaskRequest(task_id=f"{offset:032x}", model="m", submitted_at_ms=1)
    return ConsumerRecord(
        topic=TOPIC,
        partition=0,
        offset=offset,
        timestamp=-1,
        timestamp_type=0,
        key=None,
        value=request.SerializeToString(),
        checksum=None,
        serialized_key_size=-1,
        serialized_value_size=-1,
        headers=(),
    )

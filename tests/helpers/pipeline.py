"""What the reference model answers, and what the real broker holds: dead letters and
committed offsets, read past Brimful."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from brimful.core.kafka import connection_options, stream_topic
from brimful.core.settings import Settings
from brimful.schemas import DeadLetter
from brimful.stack import EmbeddedStack

_ALPHABET = 'abcXYZ019 ñé漢字🙂\u0301\n"\\'


def random_text(rng: random.Random, max_bytes: int = 4096) -> str:
    """A text of 0..max_bytes UTF-8 bytes mixing ASCII, accents, CJK, emoji and escapes."""
    target = rng.randint(0, max_bytes)
    chars: list[str] = []
    size = 0
    while True:
        char = rng.choice(_ALPHABET)
        width = len(char.encode())
        if size + width > target:
            return "".join(chars)
        chars.append(char)
        size += width


def expected_outputs(text: str) -> dict[str, Any]:
    data = text.encode()
    return {"SHA256": hashlib.sha256(data).hexdigest(), "LENGTH": len(data)}


async def read_dead_letters(stack: EmbeddedStack) -> list[DeadLetter]:
    """Every message on the DLQ topic, read from the beginning."""
    records = await read_whole_topic(stack.settings, stack.settings.dlq_topic)
    return [DeadLetter.FromString(value) for _, _, value in records]


async def committed_offset(settings: Settings, partition: int) -> int:
    """The batchers' committed offset on one partition of the requests topic (-1 if none)."""
    consumer = AIOKafkaConsumer(
        **connection_options(settings), group_id=settings.consumer_group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        committed = await consumer.committed(TopicPartition(settings.requests_topic, partition))
        return -1 if committed is None else int(committed)
    finally:
        await consumer.stop()


async def read_whole_topic(settings: Settings, topic: str, timeout_s: float = 30.0) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` as (partition, offset, value), from the start to the end
    (small topics: ``stream_topic`` reads a fetch at a time)."""
    records: list[tuple[int, int, bytes]] = []
    async for chunk in stream_topic(settings, topic, stall_timeout_s=timeout_s):
        records.extend(chunk)
    return records

"""Writing dead letters: tasks that used up their retries, with everything on-call needs."""

from __future__ import annotations

import asyncio
from typing import Sequence

from aiokafka import AIOKafkaProducer

from schemas import DeadLetter


class DeadLetterWriter:
    """Appends DeadLetter messages to the DLQ topic, keyed by task_id, acks=all."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self._producer = producer
        self._topic = topic

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Return once every letter is acknowledged by the broker; raise otherwise."""
        sends = [
            await self._producer.send(
                self._topic, value=letter.SerializeToString(), key=letter.request.task_id.encode()
            )
            for letter in letters
        ]
        await asyncio.gather(*sends)

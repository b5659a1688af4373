"""Dead letters: building them, with everything on-call needs, and writing them to the DLQ topic."""

from __future__ import annotations

import asyncio
from typing import Sequence

from aiokafka import AIOKafkaProducer
from brimful.core.model_signature import ModelSignature
from brimful.schemas import Attempt, DeadLetter, TaskRequest


def dead_letter(
    request: TaskRequest,
    error_class: str,
    error_message: str,
    partition: int,
    offset: int,
    failed_at_ms: int,
    *,
    attempts: Sequence[Attempt] = (),
    batch_id: str = "",
    batch_task_ids: Sequence[str] = (),
    signature: ModelSignature | None = None,
    raw_request: bytes = b"",
) -> DeadLetter:
    """The dead letter of one request: what failed, how often, in which batch, and where
    the request sat in the requests topic (``raw_request`` when it could not be decoded)."""
    return DeadLetter(
        request=request,
        error_class=error_class,
        error_message=error_message,
        attempts=list(attempts),
        batch_id=batch_id,
        batch_task_ids=list(batch_task_ids),
        model=signature.name if signature else request.model,
        model_version=signature.version if signature else "",
        source_partition=partition,
        source_offset=offset,
        failed_at_ms=failed_at_ms,
        raw_request=raw_request,
    )


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

"""Dead letters: building them, with everything on-call needs, and writing them to the DLQ topic."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import RecordMetadata

from brimful.core import metrics
from brimful.core.dead_letter_index import DeadLetterIndex
from brimful.core.model_catalogue import ModelSignature
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


# What a record batch adds around one dead letter (headers, key, lengths).
_RECORD_OVERHEAD_BYTES = 256


def fit_to_broker(letter: DeadLetter, max_bytes: int) -> DeadLetter:
    """The letter itself, or, when it would pass the broker's message limit, a copy without
    the request's inputs (and the raw record) that says what was dropped: a dead letter
    the broker refuses would leave its task unfinished and its partition stalled."""
    budget = max_bytes - _RECORD_OVERHEAD_BYTES
    if letter.ByteSize() <= budget:
        return letter
    trimmed = without_inputs(letter, f"exceeded the broker's limit of {max_bytes} bytes")
    if trimmed.ByteSize() > budget:  # a huge batch or attempt list: keep only what fits for sure
        del trimmed.attempts[:-3]
        del trimmed.batch_task_ids[:]
    return trimmed


def without_inputs(letter: DeadLetter, why: str) -> DeadLetter:
    """A copy of the letter without the request's inputs (and the raw record), saying what
    was dropped and ``why``."""
    trimmed = DeadLetter()
    trimmed.CopyFrom(letter)
    dropped = trimmed.request.ByteSize() + len(trimmed.raw_request)
    trimmed.request.ClearField("inputs")
    trimmed.raw_request = b""
    trimmed.error_message = (
        f"{letter.error_message[:1000]} [the request's inputs ({dropped} bytes) were dropped: the dead letter "
        f"{why}, so it cannot be replayed]"
    )
    return trimmed


class DeadLetterWriter:
    """Appends DeadLetter messages to the DLQ topic, keyed by task_id, acks=all, each
    made to fit the broker's message limit, and records where each landed (``index``)."""

    def __init__(
        self, producer: AIOKafkaProducer, topic: str, max_message_bytes: int, index: DeadLetterIndex | None = None
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._max_message_bytes = max_message_bytes
        self._index = index

    async def _send(self, letter: DeadLetter) -> asyncio.Future[RecordMetadata]:
        sent: asyncio.Future[RecordMetadata] = await self._producer.send(
            self._topic, value=letter.SerializeToString(), key=letter.request.task_id.encode()
        )
        return sent

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Return once every letter is acknowledged by the broker; raise otherwise. A letter
        the broker itself refuses as too large (its message.max.bytes below the setting) is
        written again without its inputs."""
        sends = [await self._send(fit_to_broker(letter, self._max_message_bytes)) for letter in letters]
        landed: list[RecordMetadata] = []
        for letter, sent in zip(letters, await asyncio.gather(*sends, return_exceptions=True), strict=True):
            if isinstance(sent, MessageSizeTooLargeError):
                sent = await (await self._send(without_inputs(letter, "was refused by the broker as too large")))
            elif isinstance(sent, BaseException):
                raise sent
            landed.append(sent)
        if self._index is not None:
            # Written again with the letter if this fails (the batch is retried): an
            # unindexed letter is still found by a bounded scan.
            await self._index.add(
                (letter.request.task_id, sent.partition, sent.offset) for letter, sent in zip(letters, landed)
            )
        for letter in letters:  # counted once acknowledged: a letter that failed to land is retried, not counted
            metrics.DEAD_LETTERS.labels(letter.request.model or "unknown", letter.error_class or "unknown").inc()

"""A dead letter as on-call sees it: an entry at its place in the DLQ topic with what was
done about it, the filters that select entries, a page of them, and the Parquet export's
row shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.json_format import MessageToDict

from brimful.schemas import DeadLetter


def parse_cursor(text: str) -> tuple[int, int]:
    """An entry id ``partition-offset`` as a place in the topic; ValueError otherwise."""
    partition, _, offset = text.partition("-")
    if not (partition.isascii() and partition.isdigit() and offset.isascii() and offset.isdigit()) or len(text) > 40:
        raise ValueError(f"not an entry id (partition-offset): {text[:64]!r}")
    if int(partition) >= 2**31 or int(offset) >= 2**63:  # Kafka's int32 partitions and int64 offsets
        raise ValueError(f"no such place in a topic: {text[:64]!r}")
    return int(partition), int(offset)


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which entries an action applies to; empty fields match everything."""

    since_ms: int | None = None
    until_ms: int | None = None
    error_class: str | None = None
    model: str | None = None
    ids: tuple[str, ...] = ()  # entry ids or task ids
    include_resolved: bool = False
    tenant: str | None = None  # only this tenant's entries; None: every tenant's

    def matches(self, entry: DeadLetterEntry) -> bool:
        letter = entry.letter
        if self.tenant is not None and letter.request.tenant != self.tenant:
            return False
        if self.ids and entry.entry_id not in self.ids and letter.request.task_id not in self.ids:
            return False
        if not self.include_resolved and entry.resolution is not None:
            return False
        if self.since_ms is not None and letter.failed_at_ms < self.since_ms:
            return False
        if self.until_ms is not None and letter.failed_at_ms > self.until_ms:
            return False
        if self.error_class and letter.error_class != self.error_class:
            return False
        return not (self.model and letter.model != self.model)


@dataclass(frozen=True)
class DeadLetterEntry:
    """One dead letter, where it sits in the DLQ topic, and what on-call did about it."""

    entry_id: str
    letter: DeadLetter
    resolution: dict[str, Any] | None

    def summary(self) -> dict[str, Any]:
        letter = self.letter
        return {
            "id": self.entry_id,
            "task_id": letter.request.task_id,
            "failed_at_ms": letter.failed_at_ms,
            "error_class": letter.error_class,
            "error_message": letter.error_message,
            "model": letter.model,
            "attempts": len(letter.attempts),
            "batch_id": letter.batch_id,
            "status": self.resolution["action"] if self.resolution else "open",
        }

    def row(self) -> dict[str, Any]:
        """The entry as one row of the Parquet export (``EXPORT_SCHEMA``): the summary, and
        what a replay or a post-mortem needs besides."""
        letter = self.letter
        return {
            **self.summary(),
            "model_version": letter.model_version,
            "batch_task_ids": list(letter.batch_task_ids),
            "source_partition": letter.source_partition,
            "source_offset": letter.source_offset,
            "request": letter.request.SerializeToString(),
        }

    def details(self) -> dict[str, Any]:
        letter = MessageToDict(self.letter, preserving_proto_field_name=True)
        return {**self.summary(), "resolution": self.resolution, "letter": letter}


EXPORT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("task_id", pa.string()),
        ("failed_at_ms", pa.int64()),
        ("error_class", pa.string()),
        ("error_message", pa.string()),
        ("model", pa.string()),
        ("model_version", pa.string()),
        ("attempts", pa.int32()),
        ("batch_id", pa.string()),
        ("batch_task_ids", pa.list_(pa.string())),
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
        ("status", pa.string()),
        ("request", pa.binary()),
    ]
)


@dataclass(frozen=True)
class Page:
    """One page of a DLQ operation: the entries it took, where the next page starts
    (None: the topic's end was reached) and how many letters it read to get there."""

    entries: list[DeadLetterEntry]
    next_cursor: str | None
    read: int

"""What the GPU side's unit tests run on: a small model's signature, rows for it, and a task
store that records what it is told (the real store is tested against Redis)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from brimful.core.model_catalogue import ModelSignature, TensorSpec
from brimful.schemas import InputTensor, TaskRequest
from brimful.workers.batch import BatchItem

# A model of 8 rows a call: a text in, one number out.
SIGNATURE = ModelSignature(
    name="m",
    version="1",
    batch_size=8,
    inputs=(TensorSpec("TEXT", "BYTES", (1,)),),
    outputs=(TensorSpec("N", "INT64", (1,)),),
)


def text_item(task_id: str, text: str, tenant: str = "acme", offset: int = 0) -> BatchItem:
    """A row of SIGNATURE's model holding ``text``."""
    request = TaskRequest(task_id=task_id, model="m", tenant=tenant, submitted_at_ms=1)
    request.inputs["TEXT"].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[text.encode()]))
    return BatchItem(request, partition=0, offset=offset)


class FakeStore:
    """Every task moves; what is stored, whether it came from another task's row, and the
    order of failures and letters (``events``) are recorded."""

    def __init__(self) -> None:
        self.done: dict[str, dict[str, Any]] = {}
        self.cached: set[str] = set()
        self.failed: dict[str, dict[str, Any]] = {}
        self.events: list[str] = []

    async def mark_running(self, task_ids: Iterable[str]) -> list[str]:
        return list(task_ids)

    async def recreate_missing(self, tasks: list[Any]) -> list[str]:
        return []

    async def leave_in_flight_if_final(self, tasks: list[tuple[str, str]]) -> int:
        return 0  # no in-flight sets here

    async def unfinished(self, task_ids: Iterable[str]) -> list[str]:
        return [t for t in task_ids if t not in self.done and t not in self.failed]

    async def mark_done(
        self,
        outputs_by_task: Mapping[str, Mapping[str, Any] | bytes],
        counters: Mapping[str, int] | None = None,
        done_counter: str = "",
        cached: bool = False,
        known: Mapping[str, Any] | None = None,  # no record is ever lost here
    ) -> int:
        self.done.update(
            (task_id, orjson.loads(outputs) if isinstance(outputs, bytes) else dict(outputs))
            for task_id, outputs in outputs_by_task.items()
        )
        if cached:
            self.cached.update(outputs_by_task)
        return len(outputs_by_task)

    async def mark_failed(
        self, task_ids: Iterable[str], error: Mapping[str, Any], known: Mapping[str, Any] | None = None
    ) -> int:
        ids = list(task_ids)
        self.events += [f"failed {task_id}" for task_id in ids]
        self.failed.update((task_id, dict(error)) for task_id in ids)
        return len(ids)

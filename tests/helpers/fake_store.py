"""What the GPU side's unit tests run on: a small model's signature, rows for it, a task
store and dead letters that record what they are told (the real ones are tested against
Redis and Kafka), and a fake model behind a real batch runner and model pool."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import orjson

from brimful.core.model_catalogue import ModelSignature, TensorSpec
from brimful.schemas import InputTensor, TaskRequest
from brimful.workers.batch import BatchItem
from brimful.workers.batch_runner import BatchRunner
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy

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
        self.provenance: dict[str, dict[str, Any]] = {}  # each done task's, as stored
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
        provenance: Mapping[str, bytes] | None = None,
    ) -> int:
        self.provenance.update((task_id, orjson.loads(stored)) for task_id, stored in (provenance or {}).items())
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


class FakeModel:
    """Each row's output is its text's length; a call holding a ``!fail`` row is refused."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []  # the real (non-padding) rows of each call

    async def infer(self, inputs: Mapping[str, np.ndarray], signature: ModelSignature) -> dict[str, np.ndarray]:
        texts = [row[0] for row in inputs["TEXT"]]
        assert len(texts) == signature.batch_size  # always padded to exactly the model's size
        self.calls.append([text for text in texts if text])
        if any(text.startswith(b"!fail") for text in texts):
            raise ModelCallError(ErrorClass.MODEL_ERROR, "refused")
        return {"N": np.array([[len(text)] for text in texts], dtype=np.int64)}

    async def close(self) -> None:
        pass


class FakeDeadLetters:
    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.written: list[Any] = []

    async def write(self, letters: list[Any]) -> None:
        self.store.events += [f"letter {letter.request.task_id}" for letter in letters]
        self.written += letters


class FakeStats:
    async def add(self, counters: Mapping[str, int]) -> None:
        pass


async def no_sleep(_: float) -> None:
    pass


def fake_runner(retry: BatchRetryPolicy, **options: Any) -> tuple[BatchRunner, FakeModel, FakeStore, FakeDeadLetters]:
    """A real BatchRunner on a real ModelPool of one endpoint, over FakeModel, with a
    FakeStore and dead letters that record; ``options`` go to BatchRunner."""
    model, store = FakeModel(), FakeStore()
    letters = FakeDeadLetters(store)
    endpoints = EndpointPool(1, lambda: CircuitBreaker(5, 1000.0, 1000.0, rng=random.Random(1)))
    pool = ModelPool(["model:8001"], endpoints, connect=lambda url: model, batch_size=8)  # type: ignore[arg-type, return-value]
    runner = BatchRunner(
        pool,
        SIGNATURE,
        store,  # type: ignore[arg-type]
        FakeStats(),  # type: ignore[arg-type]
        letters,  # type: ignore[arg-type]
        retry,
        sleep=no_sleep,
        **options,
    )
    return runner, model, store, letters

"""Run one batch: pad it to the model's size, call the model, unpad, store every result.

A batch that keeps failing is retried per the RetryPolicy; when the attempts are used
up its tasks become ``failed`` and their requests go to the DLQ. Running the same
batch twice is harmless: final tasks are skipped and the store lets a task reach a
final state once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from brimful import metrics
from brimful.model_signature import ModelSignature
from brimful.task_store import StatsField, TaskStore, now_ms
from brimful.tensor_codec import output_row_to_json, stack_rows
from schemas import Attempt, DeadLetter, TaskRequest
from workers.dead_letters import DeadLetterWriter
from workers.model_errors import ModelCallError
from workers.padding import pad_batch, unpad
from workers.retry_policy import RetryPolicy
from workers.triton_model import TritonModel

log = logging.getLogger("brimful.worker")


@dataclass(frozen=True)
class BatchItem:
    """One task in a batch, with where it came from."""

    request: TaskRequest
    partition: int
    offset: int

    @property
    def task_id(self) -> str:
        return self.request.task_id


@dataclass
class Batch:
    """Rows flushed together from one partition."""

    batch_id: str
    partition: int
    items: list[BatchItem]
    reason: str


@dataclass
class BatchOutcome:
    """What running a batch did."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    calls: int = 0
    attempts: list[Attempt] = field(default_factory=list)


class BatchRunner:
    """Executes batches against one model; shared by all partitions of a batcher."""

    def __init__(
        self,
        model: TritonModel,
        signature: ModelSignature,
        store: TaskStore,
        dead_letters: DeadLetterWriter,
        retry: RetryPolicy,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.model = model
        self.signature = signature
        self.store = store
        self.dead_letters = dead_letters
        self.retry = retry
        self._sleep = sleep

    async def run(self, batch: Batch) -> BatchOutcome:
        """Run the batch to a final state for every task in it; raises only on store or
        broker errors, after which running it again is safe."""
        outcome = BatchOutcome()
        already_final = await self.store.final_among(item.task_id for item in batch.items)
        items = [item for item in batch.items if item.task_id not in already_final]
        outcome.skipped = len(batch.items) - len(items)
        flushed = {StatsField.flushes(batch.reason): 1}
        if not items:
            await self.store.add_stats(flushed)
            return outcome
        await self.store.mark_running(item.task_id for item in items)

        inputs = {
            spec.name: stack_rows(spec, [item.request.inputs[spec.name] for item in items])
            for spec in self.signature.inputs
        }
        padded = pad_batch(inputs, self.signature.batch_size)
        call_stats = {
            StatsField.BATCHES_DISPATCHED: 1,
            StatsField.ROWS_DISPATCHED: len(items),
            StatsField.PADDED_SLOTS: self.signature.batch_size - len(items),
        }
        partition = str(batch.partition)
        endpoint = self.model.url
        attempt = 1
        while True:
            outcome.calls += 1
            metrics.BATCH_ROWS.labels(partition).observe(len(items))
            metrics.PADDED_SLOTS.labels(partition).inc(self.signature.batch_size - len(items))
            try:
                outputs = await self._call(padded, endpoint)
                break
            except ModelCallError as error:
                failure = error
            outcome.attempts.append(
                Attempt(at_ms=now_ms(), error_class=failure.error_class.value, error_message=failure.message)
            )
            await self.store.add_stats({**call_stats, StatsField.CALLS_FAILED: 1})
            delay = self.retry.delay_before(attempt + 1)
            log.warning(
                "model call failed",
                extra={
                    "batch_id": batch.batch_id,
                    "attempt": attempt,
                    "error_class": failure.error_class.value,
                    "error": failure.message,
                    "retry_in_s": delay,
                },
            )
            if delay is None:
                await self._fail(batch, items, failure, outcome)
                return outcome
            await self._sleep(delay)
            attempt += 1

        outputs = unpad(outputs, len(items))
        results = {
            item.task_id: {
                spec.name: output_row_to_json(spec, outputs[spec.name][row]) for spec in self.signature.outputs
            }
            for row, item in enumerate(items)
        }
        outcome.done = await self.store.mark_done(results)
        await self.store.add_stats({**call_stats, **flushed, StatsField.TASKS_DONE: outcome.done})
        finished_ms = now_ms()
        for item in items:
            metrics.TASK_LATENCY.observe(max(0, finished_ms - item.request.submitted_at_ms) / 1000)
        log.info(
            "batch done",
            extra={
                "batch_id": batch.batch_id,
                "partition": batch.partition,
                "rows": len(items),
                "reason": batch.reason,
                "calls": outcome.calls,
            },
        )
        return outcome

    async def _call(self, padded: dict[str, np.ndarray], endpoint: str) -> dict[str, np.ndarray]:
        metrics.IN_FLIGHT.labels(endpoint).inc()
        try:
            outputs = await self.model.infer(padded, self.signature)
        except ModelCallError as error:
            metrics.MODEL_CALLS.labels(endpoint, error.error_class.value).inc()
            raise
        finally:
            metrics.IN_FLIGHT.labels(endpoint).dec()
        metrics.MODEL_CALLS.labels(endpoint, "ok").inc()
        return outputs

    async def _fail(self, batch: Batch, items: list[BatchItem], error: ModelCallError, outcome: BatchOutcome) -> None:
        failed_at = now_ms()
        batch_task_ids = [item.task_id for item in batch.items]
        letters = [
            DeadLetter(
                request=item.request,
                error_class=error.error_class.value,
                error_message=error.message,
                attempts=outcome.attempts,
                batch_id=batch.batch_id,
                batch_task_ids=batch_task_ids,
                model=self.signature.name,
                model_version=self.signature.version,
                source_partition=item.partition,
                source_offset=item.offset,
                failed_at_ms=failed_at,
            )
            for item in items
        ]
        # The dead letter is written before the task reads ``failed``: a crash in
        # between repeats the batch, never loses the request.
        await self.dead_letters.write(letters)
        outcome.failed = await self.store.mark_failed(
            (item.task_id for item in items),
            {
                "class": error.error_class.value,
                "message": error.message,
                "attempts": len(outcome.attempts),
                "batch_id": batch.batch_id,
            },
        )
        await self.store.add_stats({StatsField.TASKS_FAILED: outcome.failed, StatsField.flushes(batch.reason): 1})
        for item in items:
            log.error(
                "task failed to the DLQ",
                extra={"task_id": item.task_id, "batch_id": batch.batch_id, "error_class": error.error_class.value},
            )

"""A batch as it leaves its accumulator: the rows leave the waiting set, and how long they
waited (in the accumulator, and before it) is counted, once a batch."""

from __future__ import annotations

import time
import uuid

from brimful.batcher.accumulator import Pending
from brimful.batcher.policy import FlushReason
from brimful.batcher.waiting_rows import WaitingRows
from brimful.core import metrics
from brimful.core.histogram_batches import observe_all
from brimful.workers.batch import Batch, BatchItem
from brimful.workers.slot import Slot


def flushed_batch(
    partition: int, rows: list[Pending[BatchItem]], reason: FlushReason, slot: Slot, waiting: WaitingRows, now: float
) -> Batch:
    """The batch of ``rows`` flushed from ``partition`` for ``reason`` onto ``slot`` at ``now``."""
    label = str(partition)
    metrics.FLUSHES.labels(label, reason.value).inc()
    waits = [now - row.arrived_at for row in rows]
    upstream_total = 0.0
    for row in rows:
        waiting.left(row.item.task_id)
        upstream_total += row.item.upstream_s
    observe_all(metrics.QUEUE_WAIT.labels(label), waits)
    waited_total = sum(waits)
    metrics.BATCH_STAGE.labels("to_batcher").observe(upstream_total / len(rows))
    metrics.BATCH_STAGE.labels("in_batch").observe(waited_total / len(rows))
    return Batch(
        batch_id=uuid.uuid4().hex,
        partition=partition,
        items=[row.item for row in rows],
        reason=reason.value,
        slot=slot,
        flushed_ns=time.time_ns(),
    )

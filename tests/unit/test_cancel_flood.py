"""Cancels cost a batcher a lookup each and a pass per loop turn, whatever their number:
a tenant that parks 10,000 low-priority rows and cancels them all must not make the
batcher scan every waiting row per cancel. Pure control flow, on a virtual clock."""

from __future__ import annotations

import random

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from brimful.batcher.limits import BatcherLimits
from brimful.batcher.service import BatcherService
from brimful.core.policy_params import PolicyParams
from brimful.schemas import TaskRequest
from brimful.workers.endpoint_pool import CircuitBreaker, EndpointPool
from brimful.workers.model_pool import ModelPool
from brimful.workers.retry_policy import BatchRetryPolicy
from tests.helpers.fake_consumer import TOPIC, FakeConsumer

PARKED = 10_000
PARTITIONS = 4


def _low_record(partition: int, offset: int) -> ConsumerRecord:  # type: ignore[type-arg]
    request = TaskRequest(task_id=f"{partition:04x}{offset:028x}", model="m", submitted_at_ms=1, low_priority=True)
    return ConsumerRecord(
        topic=TOPIC,
        partition=partition,
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


def test_ten_thousand_cancels_cost_one_pass_per_queue_and_finish_every_offset() -> None:
    now = 100.0
    endpoints = EndpointPool(1, lambda: CircuitBreaker(1, 1000.0, 1000.0, rng=random.Random(1)))
    pool = ModelPool(["model:8001"], endpoints, connect=lambda url: None, batch_size=64, clock=lambda: now)  # type: ignore[arg-type, return-value]
    pool.reserve(64)  # the only slot busy: nothing is dispatched while the test looks
    service = BatcherService(
        FakeConsumer(),
        TOPIC,
        runner=None,  # type: ignore[arg-type]  # no batch runs here
        pool=pool,
        retry=BatchRetryPolicy(),
        dead_letters=None,  # type: ignore[arg-type]
        params=PolicyParams(),
        limits=BatcherLimits(max_low_pending_per_partition=PARKED),
        clock=lambda: now,
    )
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    service.assign(tps)
    per_partition = PARKED // PARTITIONS
    service._intake.accept({tp: [_low_record(tp.partition, offset) for offset in range(per_partition)] for tp in tps})
    passes = 0
    for state in service._partitions.values():
        original = state.low.remove

        def counted(matches, original=original):  # type: ignore[no-untyped-def]
            nonlocal passes
            passes += 1
            return original(matches)

        state.low.remove = counted  # type: ignore[method-assign]

    assert not service.cancel("f" * 32)  # not held here: a lookup
    task_ids = [f"{p:04x}{o:028x}" for p in range(PARTITIONS) for o in range(per_partition)]
    assert all(service.cancel(task_id) for task_id in task_ids[: PARKED - 1])  # all but one
    assert passes == 0  # nothing scanned yet
    service._dispatch_due()
    assert passes == PARTITIONS  # one pass a queue for all of them
    lows = {number: len(state.low) for number, state in service._partitions.items()}
    assert lows == {0: 0, 1: 0, 2: 0, 3: 1}
    # Every cancelled row's offset is finished: only the one left holds its partition back.
    trackers = {number: state.tracker.safe_to_commit for number, state in service._partitions.items()}  # type: ignore[union-attr]
    assert trackers == {0: per_partition, 1: per_partition, 2: per_partition, 3: per_partition - 1}
    assert not service.cancel(task_ids[0])  # gone already

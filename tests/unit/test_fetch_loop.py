"""The batcher's fetch loop ends once its consumer is stopped, instead of asking it for
records twice a second for ever. A generation's consumer is stopped after its service
ends; a fetch loop that outlived the service (a cancellation lost on the way) spun on
``ConsumerStoppedError`` thousands of times in a soak's log (bench/results/reliability-log.md)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import ConsumerStoppedError

from brimful.batcher.intake import Estimates, Intake
from brimful.batcher.limits import BatcherLimits
from brimful.batcher.partition_state import WaitingRows


async def test_the_fetch_loop_ends_when_its_consumer_is_stopped() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")  # aiokafka's own, stopped: no broker asked
    await consumer.stop()
    woken: list[None] = []
    intake = Intake(
        consumer,
        partitions={},
        waiting=WaitingRows(),
        estimates=Estimates(),
        limits=BatcherLimits(),
        dead_letters=cast(Any, None),  # the loop below writes none
        retry=cast(Any, None),
        clock=lambda: 0.0,
        wake=lambda: woken.append(None),
        finish_offsets=lambda state, offsets: None,
    )
    with pytest.raises(ConsumerStoppedError):
        async with asyncio.timeout(5):  # a loop that retries would run into this instead
            await intake.fetch_loop()
    assert woken == []

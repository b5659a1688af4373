"""Offsets are committed no sooner than ``commit_after_stored_s`` after their batch's
results were stored: a Redis that syncs its log every second loses up to that much to a
kill, and the records of what it lost must be read again. The committer on the real
event loop, with a stand-in consumer that records commits."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from brimful.batcher.accumulator import Accumulator
from brimful.batcher.partition_state import GapPatience, OffsetCommitter, OffsetTracker, PartitionState
from brimful.batcher.policy import WaitOrFullPolicy
from brimful.core.policy_params import PolicyParams
from tests.helpers.fake_consumer import TOPIC, FakeConsumer
from tests.helpers.polling import wait_for


@pytest.mark.timeout(10)
async def test_offsets_wait_their_lag_and_later_ones_wait_for_the_next_round() -> None:
    consumer = FakeConsumer()
    tp = TopicPartition(TOPIC, 0)
    state = PartitionState(tp, Accumulator(WaitOrFullPolicy(PolicyParams())), GapPatience(1.0), OffsetTracker(0))
    for offset in range(4):
        state.tracker.receive(offset)  # type: ignore[union-attr]
    partitions = {0: state}
    committer = OffsetCommitter(consumer, lambda: partitions, timeout_s=5.0, every_s=0.01, after_stored_s=0.3)
    running = asyncio.create_task(committer.run())
    try:
        loop = asyncio.get_running_loop()
        for offset in (0, 1):
            state.tracker.finish(offset)  # type: ignore[union-attr]
        committer.want()
        finished_at = loop.time()
        await asyncio.sleep(0.1)
        state.tracker.finish(2)  # type: ignore[union-attr]  # finished while the first round waits
        committer.want()
        await wait_for(lambda: len(consumer.commits) >= 1, 5, "the first commit", interval_s=0.01)
        assert loop.time() - finished_at >= 0.3
        assert consumer.commits[0][tp].offset == 2  # offset 2 waits for a round of its own
        await wait_for(lambda: len(consumer.commits) >= 2, 5, "the second commit", interval_s=0.01)
        assert consumer.commits[1][tp].offset == 3
        assert state.committed == 3
    finally:
        running.cancel()


async def test_a_partition_revoked_during_a_round_is_not_committed_by_it() -> None:
    consumer = FakeConsumer()
    tp = TopicPartition(TOPIC, 0)
    state = PartitionState(tp, Accumulator(WaitOrFullPolicy(PolicyParams())), GapPatience(1.0), OffsetTracker(0))
    state.tracker.receive(0)  # type: ignore[union-attr]
    state.tracker.finish(0)  # type: ignore[union-attr]
    partitions = {0: state}
    committer = OffsetCommitter(consumer, lambda: partitions, timeout_s=5.0, every_s=0.01, after_stored_s=0.2)
    running = asyncio.create_task(committer.run())
    try:
        committer.want()
        await asyncio.sleep(0.05)  # the round has begun and waits out after_stored_s
        partitions.clear()  # revoked meanwhile: its next owner commits it
        await asyncio.sleep(0.3)
        assert consumer.commits == []
    finally:
        running.cancel()

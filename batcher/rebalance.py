"""What a batcher's consumer does when the group moves partitions: the service gives up
the revoked ones (committing what finished) before taking the assigned ones."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition


class PartitionOwner(Protocol):
    """What a rebalance needs of the service (``batcher.service.BatcherService``)."""

    def revoke(self, revoked: list[TopicPartition]) -> Awaitable[None]: ...

    def assign(self, assigned: list[TopicPartition]) -> None: ...


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types
    """Hands the consumer's rebalance callbacks to the service."""

    def __init__(self, owner: PartitionOwner) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._owner.revoke(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._owner.assign(assigned)

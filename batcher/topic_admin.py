"""What the batcher's generations ask of the broker and of the other batchers: the
topics there are, a generation's topic created or deleted, and the generations a live
batcher holds. Each ask is bounded in time."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAlreadyExistsError

from brimful.core.kafka import requests_topic_spec
from brimful.core.settings import Settings
from brimful.core.status_board import StatusBoard


class TopicAdmin:
    """The requests topics' generations on the broker, through one admin client."""

    def __init__(self, settings: Settings, admin: AIOKafkaAdminClient) -> None:
        self._settings = settings
        self._admin = admin
        self._timeout_s = settings.kafka_request_timeout_ms / 1000

    async def list_topics(self) -> set[str]:
        return set(await asyncio.wait_for(self._admin.list_topics(), self._timeout_s))

    async def create_topics(self, topics: list[str]) -> None:
        wanted = [requests_topic_spec(self._settings, topic) for topic in topics]
        try:
            await asyncio.wait_for(self._admin.create_topics(wanted), self._timeout_s)
        except TopicAlreadyExistsError:
            pass  # an API worker or another batcher made it first

    async def delete_topic(self, topic: str) -> None:
        await asyncio.wait_for(self._admin.delete_topics([topic]), self._timeout_s)


class LiveGenerations:
    """The generations of a model that live batchers hold, from the status board (an
    entry expires a few seconds after its batcher stops refreshing it: ``batcher/upkeep.py``)."""

    def __init__(self, board: StatusBoard, model: str, timeout_s: float) -> None:
        self._board = board
        self._model = model
        self._timeout_s = timeout_s

    async def held(self) -> set[int]:
        entries = await asyncio.wait_for(self._board.read_all(), self._timeout_s)
        return {int(e["generation"]) for e in entries if e.get("model") == self._model and "generation" in e}

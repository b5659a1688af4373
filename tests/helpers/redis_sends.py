"""A spy on what a Redis client sends over the wire: each send is one round trip."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis


class SendCounter:
    """Counts the sends of ``redis``'s connections while it is installed (``start``)."""

    def __init__(self, redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sends = 0
        self._connection_class = redis.connection_pool.connection_class
        self._monkeypatch = monkeypatch

    def start(self) -> SendCounter:
        real_send = self._connection_class.send_packed_command

        async def counting_send(connection: object, *args: object, **kwargs: object) -> None:
            self.sends += 1
            await real_send(connection, *args, **kwargs)

        self._monkeypatch.setattr(self._connection_class, "send_packed_command", counting_send)
        return self

    def stop(self) -> int:
        """Uninstall; the sends counted."""
        self._monkeypatch.undo()
        return self.sends

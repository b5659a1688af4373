"""While the API waits for the broker, each producer it makes again comes with a DLQ admin
built from the same settings as the first: none of them is dropped on the way."""

from __future__ import annotations

import asyncio

from brimful.api.state import ApiState
from brimful.core.settings import Settings
from brimful.stack import free_port
from tests.helpers.polling import wait_for


async def test_the_dlq_admin_made_again_while_waiting_for_the_broker_keeps_its_read_limit() -> None:
    # Nothing listens on the broker's port: each start fails and the producer is made again.
    state = ApiState(Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}", dlq_read_max_letters=7))
    first = state.dead_letters
    waiting = asyncio.create_task(state._start_producer())
    try:
        await wait_for(lambda: state.dead_letters is not first, 10, "the producer to be made again")
        assert state.dead_letters.read_max == 7
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await state.producer.stop()
        await state.redis.aclose()

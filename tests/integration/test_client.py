"""The Python client against the real stack."""

from __future__ import annotations

import pytest

from brimful.stack import EmbeddedStack
from brimful_client import AsyncClient, BrimfulError, Client, TaskFailed
from tests.integration.test_pipeline import expected_outputs


async def test_async_map_over_1000_inputs_returns_every_result_in_order(stack: EmbeddedStack) -> None:
    texts = [f"map {i} ✓" for i in range(1000)]
    async with AsyncClient(stack.api_url) as client:
        outputs = await client.map([{"TEXT": t} for t in texts])
    assert outputs == [expected_outputs(t) for t in texts]


def test_sync_client_submit_result_map_and_errors(stack: EmbeddedStack) -> None:
    with Client(stack.api_url) as client:
        task_id = client.submit({"TEXT": "sync"})
        assert client.result(task_id) == expected_outputs("sync")
        texts = [f"sync map {i}" for i in range(200)]
        assert client.map([{"TEXT": t} for t in texts]) == [expected_outputs(t) for t in texts]
        with pytest.raises(TaskFailed) as failed:
            client.result(client.submit({"TEXT": "!fail via the client"}))
        assert failed.value.code == "model_error"
        with pytest.raises(BrimfulError) as refused:
            client.submit({"TEXT": 42})
        assert refused.value.status == 422 and refused.value.code == "invalid_input"
        with pytest.raises(BrimfulError) as bad_item:
            client.map([{"TEXT": "fine"}, {"TEXT": None}])
        assert "input 1" in bad_item.value.message

"""The Python client against the real stack."""

from __future__ import annotations

import uuid

import pytest

from brimful.model_server.embedding_model import MODEL_NAME, embed
from brimful.stack import EmbeddedStack
from brimful_client import AsyncClient, BrimfulError, Client, TaskFailed
from tests.helpers.pipeline import expected_outputs


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


async def test_the_client_lists_the_models_and_sends_the_model_it_is_given(stack: EmbeddedStack) -> None:
    async with AsyncClient(stack.api_url) as client:
        default, model, embedding = await client.models()
        assert default["name"] == stack.settings.model_name and default["default"] is True
        assert embedding["kind"] == "embedding" and model["kind"] == default["kind"] == "tensor"
        assert model["name"] == stack.settings.served_models[1] and model["default"] is False
        task_id = await client.submit({"TEXT": "client names it"}, model=model["name"])
        assert (await client.status(task_id, wait_s=20))["model"] == model["name"]
        assert await client.map([{"TEXT": "mapped"}], model=model["name"]) == [expected_outputs("mapped")]
        with pytest.raises(BrimfulError) as unknown:
            await client.submit({"TEXT": "x"}, model="no_such_model")
        assert unknown.value.status == 422 and unknown.value.code == "unknown_model"
        with pytest.raises(BrimfulError) as unknown_in_bulk:
            await client.map([{"TEXT": "x"}], model="no_such_model")
        assert unknown_in_bulk.value.code == "unknown_model"
    with Client(stack.api_url) as sync:
        assert [m["name"] for m in sync.models()] == stack.settings.served_models


async def test_the_client_sends_priority_and_cache(stack: EmbeddedStack) -> None:
    async with AsyncClient(stack.api_url) as client:
        text = {"TEXT": f"client bulk {uuid.uuid4().hex}"}
        assert await client.map([text], priority="low") == [expected_outputs(text["TEXT"])]
        again = await client.submit(text)
        assert (await client.status(again, wait_s=20))["cached"] is True
        fresh = await client.submit(text, cache=False)
        assert (await client.status(fresh, wait_s=20))["cached"] is False
        with pytest.raises(BrimfulError) as refused:
            await client.submit(text, priority="urgent")
        assert refused.value.status == 422 and "priority" in refused.value.message


async def test_the_client_embeds_texts_in_order(stack: EmbeddedStack) -> None:
    texts = ["first text", "second one", "first text"]
    expected = [embed(text.encode()).tolist() for text in texts]
    async with AsyncClient(stack.api_url) as client:
        assert await client.embed(texts, MODEL_NAME) == expected
        with pytest.raises(BrimfulError) as refused:
            await client.embed(texts, stack.settings.model_name)  # not an embedding model
        assert refused.value.status == 400 and "not an embedding model" in str(refused.value)
    with Client(stack.api_url) as sync:
        assert sync.embed(texts[:1], MODEL_NAME) == expected[:1]

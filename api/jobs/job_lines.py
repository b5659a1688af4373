"""One line of a batch job's input file, in OpenAI's shape: what it asks for, checked
(``parse_line``), and what the output or error file says of it once it ran.

A line is ``{"custom_id", "method": "POST", "url", "body"}``; ``url`` is the job's endpoint,
``/v1/embeddings`` (the body as ``POST /v1/embeddings`` takes it: a task per input) or
Brimful's ``/v1/tasks`` (one task). Its tasks always run at low priority, so a job fills
the padding of interactive calls. A line that does not fit is refused with its own error,
in the error file; it never stops the job.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from brimful.api.http.bodies import ApiError
from brimful.api.openai.embedding_request import EMBEDDINGS_PATH, EmbeddingRequest, parse_embedding_request
from brimful.api.openai.token_ids import TokenVocabulary
from brimful.api.tasks.submission import Submission, parse_submission
from brimful.core.model_catalogue import ModelCatalogue

ENDPOINTS = (EMBEDDINGS_PATH, "/v1/tasks")
MAX_CUSTOM_ID_LENGTH = 512
LINE_FIELDS = frozenset({"custom_id", "method", "url", "body"})


class LineError(Exception):
    """A line that cannot run: its code and message go to the error file."""

    def __init__(self, code: str, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.custom_id = code, message, custom_id


@dataclass(frozen=True)
class BatchLine:
    """A checked line: its tasks, in order."""

    custom_id: str
    submissions: tuple[Submission, ...]
    embedding: EmbeddingRequest | None = None  # the embeddings request it carries, if that is its endpoint


def parse_line(
    raw: bytes, endpoint: str, catalogue: ModelCatalogue, max_inputs: int, vocabulary: TokenVocabulary | None = None
) -> BatchLine:
    """Check one line against the job's endpoint; LineError naming the first problem."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise LineError("invalid_json", f"the line is not valid JSON: {error}"[:300]) from error
    if not isinstance(document, dict):
        raise LineError("invalid_request", 'a line must be a JSON object {"custom_id", "method", "url", "body"}')
    custom_id = document.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID_LENGTH:
        raise LineError("invalid_custom_id", f"custom_id must be a string of 1-{MAX_CUSTOM_ID_LENGTH} characters")
    unknown = sorted(set(document) - LINE_FIELDS)
    if unknown:
        raise LineError("invalid_request", f"unknown field(s): {', '.join(unknown)}", custom_id)
    if document.get("method") != "POST":
        raise LineError("invalid_method", "method must be POST", custom_id)
    if document.get("url") != endpoint:
        raise LineError("invalid_url", f"url must be the batch's endpoint, {endpoint}", custom_id)
    body = document.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", custom_id)
    try:
        if endpoint == EMBEDDINGS_PATH:
            ask = parse_embedding_request(body, catalogue, max_inputs, vocabulary)
            low = tuple(dataclasses.replace(s, low_priority=True) for s in ask.submissions)
            return BatchLine(custom_id, low, dataclasses.replace(ask, submissions=low))
        submission = parse_submission(body, catalogue)
    except ApiError as error:
        raise LineError(error.code, error.message, custom_id) from error
    return BatchLine(custom_id, (dataclasses.replace(submission, low_priority=True),))


def output_line(custom_id: str, request_id: str, status_code: int, body: dict[str, Any]) -> bytes:
    """A line of the output file (``status_code`` 200) or of the error file (the failure's
    status, ``body`` then OpenAI's ``{"error": ...}``)."""
    return orjson.dumps(
        {
            "id": f"batch_req_{secrets.token_hex(12)}",
            "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def error_line(custom_id: str | None, code: str, message: str) -> bytes:
    """A line of the error file for a line that never ran (refused, cancelled, expired)."""
    return orjson.dumps(
        {
            "id": f"batch_req_{secrets.token_hex(12)}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )

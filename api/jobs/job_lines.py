"""One line of a batch job's input file, in OpenAI's shape: what it asks for, checked
(``parse_line``), and what the output or error file says of it once it ran.

A line is ``{"custom_id", "method": "POST", "url", "body"}``; ``url`` is the job's endpoint,
``/v1/embeddings`` (the body as ``POST /v1/embeddings`` takes it: a task per input) or
Brimful's ``/v1/tasks`` (one task). Its tasks always run at low priority, so a job fills
the padding of interactive calls. A line that does not fit fails the job at validating,
listed in its errors (``InputCheck``: OpenAI's way); or, where the job asks for it
(``invalid_lines: error_file``), is answered with its own error in the error file while
the rest run.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import AsyncIterator
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
MAX_LINE_BYTES = 8 * 1024 * 1024  # a line is one request: far above any the API takes
LINE_FIELDS = frozenset({"custom_id", "method", "url", "body"})


class LineError(Exception):
    """A line that cannot run: its code and message go to the error file."""

    def __init__(self, code: str, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.custom_id = code, message, custom_id


async def non_blank(lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A file's lines with the blank ones left out: a job's lines are its non-blank ones."""
    async for line in lines:
        if line.strip():
            yield line


def custom_id_of(raw: bytes) -> str | None:
    """A line's ``custom_id`` where it has one (a JSON object with a non-empty string
    there), else None: what names a line already run or failed, without checking it."""
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    custom_id = document.get("custom_id") if isinstance(document, dict) else None
    return custom_id if isinstance(custom_id, str) and custom_id else None


def duplicate(custom_id: str) -> LineError:
    return LineError("duplicate_custom_id", "an earlier line has the same custom_id", custom_id)


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
        raise LineError("invalid_json_line", f"the line is not valid JSON: {error}"[:300]) from error
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
        raise LineError("url_mismatch", f"url must be the batch's endpoint, {endpoint}", custom_id)
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


MAX_LISTED_INVALID = 100  # invalid lines a failed job's errors list


@dataclass
class InputCheck:
    """The validating step's read of a job's input: its lines counted and, with a catalogue,
    each checked as it would run; the first ``MAX_LISTED_INVALID`` invalid ones kept as
    OpenAI's Batch errors (``code``, ``message``, ``line``, counted from 1)."""

    endpoint: str
    catalogue: ModelCatalogue | None  # None: lines counted, not checked
    max_inputs: int
    vocabulary: TokenVocabulary | None = None
    lines: int = 0
    invalid: int = 0
    listed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seen: set[str] = dataclasses.field(default_factory=set)  # the custom ids so far

    def add(self, raw: bytes) -> None:
        self.lines += 1
        if self.catalogue is None:
            return
        try:
            line = parse_line(raw, self.endpoint, self.catalogue, self.max_inputs, self.vocabulary)
            if line.custom_id in self.seen:
                raise duplicate(line.custom_id)
            self.seen.add(line.custom_id)
        except LineError as error:
            self.invalid += 1
            if len(self.listed) < MAX_LISTED_INVALID:
                self.listed.append({"code": error.code, "message": error.message, "param": None, "line": self.lines})

    def errors(self) -> list[dict[str, Any]]:
        """The invalid lines, as the failed job's ``errors`` list them."""
        unlisted = self.invalid - len(self.listed)
        more = f"{unlisted} more invalid lines are not listed; the first {len(self.listed)} are"
        summary = [{"code": "too_many_invalid_lines", "message": more, "param": None, "line": None}]
        return self.listed + (summary if unlisted else [])


def output_line(
    custom_id: str,
    request_id: str,
    status_code: int,
    body: dict[str, Any],
    provenance: list[dict[str, Any]] | None = None,
) -> bytes:
    """A line of the output file (``status_code`` 200) or of the error file (the failure's
    status, ``body`` then OpenAI's ``{"error": ...}``). ``provenance``: an embeddings line's,
    an entry an input in order (``body`` is OpenAI's embeddings answer, which has no room
    for it; a task line's body is the task's answer, which holds its own)."""
    line: dict[str, Any] = {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": None,
    }
    if provenance:
        line["provenance"] = provenance
    return orjson.dumps(line)


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

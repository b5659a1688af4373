"""Turning a POST body into wire inputs: every check a submitted task must pass."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from brimful.model_signature import ModelSignature
from brimful.tensor_codec import InputValidationError, encode_input
from schemas import InputTensor

_ALLOWED_FIELDS = ("inputs", "deadline_ms")
MAX_DEADLINE_MS = 3_600_000


@dataclass(frozen=True)
class Submission:
    """A validated task, ready to be written to the requests topic."""

    inputs: dict[str, InputTensor]
    deadline_ms: int | None = None  # the client wants the result within this many ms

    @property
    def payload_bytes(self) -> int:
        """Size of the encoded inputs: what the tenant's payload limit is measured on."""
        return sum(tensor.ByteSize() for tensor in self.inputs.values())


def parse_json(body: bytes) -> Any:
    """Decode the body as JSON or raise a 400 saying where it breaks."""
    try:
        return json.loads(body)
    except UnicodeDecodeError as error:
        raise ApiError(400, "invalid_json", f"body is not UTF-8: {error.reason} at byte {error.start}") from error
    except json.JSONDecodeError as error:
        raise ApiError(
            400, "invalid_json", f"body is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from error


def parse_submission(document: Any, signature: ModelSignature) -> Submission:
    """Check a decoded body against the model's signature; 422 naming the first problem."""
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", 'body must be a JSON object like {"inputs": {...}}')
    unknown_fields = sorted(set(document) - set(_ALLOWED_FIELDS))
    if unknown_fields:
        raise ApiError(
            422, "invalid_request", f"unknown field(s): {', '.join(unknown_fields)}; allowed: {', '.join(_ALLOWED_FIELDS)}"
        )
    inputs = document.get("inputs")
    if not isinstance(inputs, dict):
        raise ApiError(422, "invalid_request", 'body must have an "inputs" object mapping input names to values')
    expected = signature.input_names
    missing = [name for name in expected if name not in inputs]
    unknown = sorted(name for name in inputs if name not in expected)
    if unknown:
        raise ApiError(
            422, "unknown_input", f"unknown input(s): {', '.join(unknown)}; model {signature.name} takes: {', '.join(expected)}"
        )
    if missing:
        raise ApiError(422, "missing_input", f"missing input(s): {', '.join(missing)}")
    deadline_ms = document.get("deadline_ms")
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int) or not 1 <= deadline_ms <= MAX_DEADLINE_MS
    ):
        raise ApiError(
            422, "invalid_request", f"deadline_ms must be a whole number of milliseconds from 1 to {MAX_DEADLINE_MS}"
        )
    encoded: dict[str, InputTensor] = {}
    for spec in signature.inputs:
        try:
            encoded[spec.name] = encode_input(spec, inputs[spec.name])
        except InputValidationError as error:
            raise ApiError(422, "invalid_input", str(error)) from error
    return Submission(inputs=encoded, deadline_ms=deadline_ms)

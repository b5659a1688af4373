"""The shapes of the API's answers and the helpers that state them, as the OpenAPI document
shows them (``api/openapi/document.py``, ``api/openapi/openai_operations.py``)."""

from __future__ import annotations

from typing import Any

from brimful.api.tasks.idempotency import IDEMPOTENCY_KEY_MAX_LENGTH
from brimful.api.tasks.task_routes import TASK_ID_PATTERN
from brimful.core.model_catalogue import MODEL_KINDS
from brimful.core.task_record import TaskStatus

TASK_STATE: dict[str, Any] = {
    "type": "object",
    "required": ["task_id", "status", "submitted_at_ms", "updated_at_ms"],
    "properties": {
        "task_id": {"type": "string", "pattern": TASK_ID_PATTERN.pattern},
        "model": {"type": "string", "description": "the model the task is for"},
        "status": {"type": "string", "enum": [status.value for status in TaskStatus]},
        "submitted_at_ms": {"type": "integer"},
        "updated_at_ms": {"type": "integer"},
        "outputs": {"type": "object", "description": "the model's outputs for this row, when done"},
        "cached": {
            "type": "boolean",
            "description": "when done: true if an identical task's result answered it "
            "(from the cache, or computed beside it), with no model call of its own",
        },
        "error": {
            "type": "object",
            "description": "class, message, attempts, batch_id, when failed; class expired, message, deadline_at_ms, "
            "when its deadline passed before it was sent to the model",
        },
    },
}
ACCEPTED = {
    "type": "object",
    "required": ["task_id", "model", "status"],
    "properties": {"task_id": {"type": "string"}, "model": {"type": "string"}, "status": {"type": "string"}},
    "example": {"task_id": "9c1e0d5e7a7b4a21b3f0c2d4e6f80912", "model": "brimful_reference", "status": "queued"},
}
TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string", "description": "Triton's, e.g. BYTES, FP32"},
        "shape": {"type": "array", "items": {"type": "integer"}, "description": "one row's, without the batch"},
    },
}
OPENAI_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "kind": {"type": "string", "enum": list(MODEL_KINDS)},
    },
}
MODELS = {
    "type": "object",
    "required": ["models", "object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": OPENAI_MODEL, "description": "the same models as OpenAI's Model objects"},
        "models": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "version", "batch_size", "inputs", "outputs", "default"],
                "properties": {
                    "name": {"type": "string"},
                    "kind": {
                        "type": "string",
                        "enum": list(MODEL_KINDS),
                        "description": "embedding: also served at POST /v1/embeddings",
                    },
                    "version": {"type": "string"},
                    "batch_size": {"type": "integer", "description": "rows in every call to the model"},
                    "inputs": {"type": "array", "items": TENSOR},
                    "outputs": {"type": "array", "items": TENSOR},
                    "default": {"type": "boolean", "description": "serves the tasks that name no model"},
                },
            },
        },
    },
}


ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "description": "what is wrong, naming the field or limit"},
                "type": {
                    "type": "string",
                    "enum": [
                        "invalid_request_error",
                        "authentication_error",
                        "permission_error",
                        "rate_limit_error",
                        "server_error",
                    ],
                    "description": "OpenAI's error type, by status",
                },
                "param": {"type": ["string", "null"], "description": "the request field at fault, where one is"},
                "code": {"type": "string", "description": "machine-readable, e.g. invalid_input, overloaded"},
            },
        }
    },
    "example": {
        "error": {
            "message": "input TEXT must be a string (BYTES), got an integer",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_input",
        }
    },
}
WHY = {
    400: "Malformed request: not JSON, not UTF-8, a bad task id, wait or Idempotency-Key; on the OpenAI-compatible "
    "routes, any parameter that does not fit, named.",
    401: "No API key, or an unknown or revoked one.",
    403: "The key lacks the scope this operation needs.",
    404: "No such task, entry, file, batch or model for this tenant (unknown, another tenant's, or expired).",
    408: "The request's headers or body did not all arrive within the read timeout (api_read_timeout_s).",
    409: "The task already left the queue; or a request with this Idempotency-Key is still being accepted "
    "(retry after Retry-After).",
    413: "The body, a task's payload (this tenant's limit) or the number of tasks is over the limit.",
    415: "A form or text body where JSON is read (an upload takes multipart/form-data).",
    422: "The body is JSON but does not fit: unknown, missing or invalid fields or inputs, or a model not "
    "served here (unknown_model).",
    429: "The tenant is over its rate limit or its limit of tasks in flight; see Retry-After.",
    502: "An input failed at the model (inference_failed), naming the input and why.",
    503: "Overloaded (the backlog, the submissions waiting in this API process, or its connections: "
    "api_max_connections), or the broker, Redis or the model is unavailable; see Retry-After.",
    504: "Some inputs were not done within long_poll_max_s; they keep running and a retry is answered "
    "from their results.",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}}

OBJECT = {"type": "object"}
IDEMPOTENCY_KEY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH},
    "description": "a retry with the same key is answered what the first try made (Idempotent-Replayed: true)",
}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def responses(ok: dict[int, tuple[str, dict[str, Any]]], errors: tuple[int, ...]) -> dict[str, Any]:
    answers: dict[str, Any] = {
        str(code): {"description": text, **json_content(schema)} for code, (text, schema) in ok.items()
    }
    for code in errors:
        answer: dict[str, Any] = {"description": WHY[code], **json_content({"$ref": "#/components/schemas/Error"})}
        if code in (409, 429, 503):
            answer["headers"] = RETRY_AFTER
        answers[str(code)] = answer
    return answers


def query_parameter(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

"""The shapes of the API's answers, as the OpenAPI document shows them (``api/openapi.py``)."""

from __future__ import annotations

from typing import Any

from brimful.api.task_routes import TASK_ID_PATTERN
from brimful.core.model_signature import MODEL_KINDS
from brimful.core.task_status import TaskStatus

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

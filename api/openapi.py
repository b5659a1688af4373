"""The OpenAPI document: every operation's body, parameters and responses, errors included.

The routes parse their bodies themselves (to answer bad input with precise 4xx), so
FastAPI cannot see what they take; this module states it, in one table, and fills the
submit body's ``model`` and ``inputs`` from the live catalogue, so the document describes
the models actually served.
"""

from __future__ import annotations

from collections.abc import Callable
from copy import deepcopy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from brimful.api.dlq_routes import DRY_RUN_FIELD, FILTER_FIELDS, PAGE_FIELDS
from brimful.api.embedding_request import embedding_request_schema
from brimful.api.embedding_routes import EMBEDDINGS_PATH
from brimful.api.openapi_shapes import ACCEPTED, MODELS, OPENAI_MODEL, TASK_STATE
from brimful.api.submission import ALLOWED_FIELDS, MAX_DEADLINE_MS, PRIORITIES
from brimful.api.task_routes import IDEMPOTENCY_KEY_MAX_LENGTH
from brimful.core.model_catalogue import ModelCatalogue
from brimful.core.model_signature import ModelSignature, TensorSpec
from brimful.core.policy_params import TUNABLE, bounds
from brimful.core.settings import Settings

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "machine-readable, e.g. invalid_input, overloaded"},
                "message": {"type": "string", "description": "what is wrong, naming the field or limit"},
            },
        }
    },
    "example": {"error": {"code": "invalid_input", "message": "input TEXT must be a string (BYTES), got an integer"}},
}
_WHY = {
    400: "Malformed request: not JSON, not UTF-8, a bad task id, wait or Idempotency-Key.",
    401: "No API key, or an unknown or revoked one.",
    403: "The key lacks the scope this operation needs.",
    404: "No such task or entry for this tenant (unknown, another tenant's, or expired).",
    408: "The request's headers or body did not all arrive within the read timeout (api_read_timeout_s).",
    409: "The task already left the queue; or a request with this Idempotency-Key is still being accepted "
    "(retry after Retry-After).",
    413: "The body, a task's payload (this tenant's limit) or the number of tasks is over the limit.",
    422: "The body is JSON but does not fit: unknown, missing or invalid fields or inputs, or a model not "
    "served here (unknown_model).",
    429: "The tenant is over its rate limit or its limit of tasks in flight; see Retry-After.",
    502: "An input failed at the model (inference_failed), naming the input and why.",
    503: "Overloaded (the backlog, the submissions waiting in this API process, or its connections: "
    "api_max_connections), or the broker, Redis or the model is unavailable; see Retry-After.",
    504: "Some inputs were not done within long_poll_max_s; they keep running and a retry is answered "
    "from their results.",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}}

_OBJECT = {"type": "object"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(ok: dict[int, tuple[str, dict[str, Any]]], errors: tuple[int, ...]) -> dict[str, Any]:
    answers: dict[str, Any] = {str(code): {"description": text, **_json(schema)} for code, (text, schema) in ok.items()}
    for code in errors:
        answer: dict[str, Any] = {"description": _WHY[code], **_json({"$ref": "#/components/schemas/Error"})}
        if code in (409, 429, 503):
            answer["headers"] = _RETRY_AFTER
        answers[str(code)] = answer
    return answers


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def input_schema(spec: TensorSpec) -> dict[str, Any]:
    """The JSON a client sends for one input: a bare value for a row of one element."""
    element: dict[str, Any]
    if spec.datatype == "BYTES":
        element = {"type": "string"}
    elif spec.datatype == "BOOL":
        element = {"type": "boolean"}
    elif spec.datatype.startswith(("INT", "UINT")):
        element = {"type": "integer"}
    else:
        element = {"type": "number"}
    if spec.row_shape in ((1,), ()):
        return element
    schema = element
    for size in reversed(spec.row_shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


def inputs_schema(signature: ModelSignature) -> dict[str, Any]:
    """The ``inputs`` object one model takes."""
    return {
        "type": "object",
        "description": f"one value per input of {signature.name}",
        "properties": {spec.name: input_schema(spec) for spec in signature.inputs},
        "required": list(signature.input_names),
        "additionalProperties": False,
    }


def submit_schema(catalogue: ModelCatalogue | None) -> dict[str, Any]:
    inputs: dict[str, Any] = {"type": "object", "description": "one value per model input"}
    model: dict[str, Any] = {
        "type": "string",
        "description": "the model to run (GET /v1/models); default: the default model",
    }
    if catalogue is not None:
        signatures = list(catalogue.models.values())
        inputs = (
            inputs_schema(signatures[0])
            if len(signatures) == 1
            else {
                # anyOf, not oneOf: two models may share a signature (the reference model at 64 and 16 rows).
                "description": "one value per input of the named model",
                "anyOf": [inputs_schema(s) for s in signatures],
            }
        )
        model.update(enum=list(catalogue.names), default=catalogue.default)
    fields: dict[str, Any] = {
        "inputs": inputs,
        "model": model,
        "deadline_ms": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_DEADLINE_MS,
            "description": "finish within this many ms if possible; a task still waiting when this passes is "
            "never computed and reads expired",
        },
        "cache": {
            "type": "boolean",
            "default": True,
            "description": "false: this task gets its own model call, never an identical task's result",
        },
        "priority": {
            "type": "string",
            "enum": list(PRIORITIES),
            "default": "normal",
            "description": "low: bulk work that fills slots normal tasks leave empty; waits at most the "
            "policy's low_max_wait_ms, then queues as normal",
        },
    }
    return {
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "properties": {name: fields[name] for name in ALLOWED_FIELDS},
        "example": {"inputs": {"TEXT": "hello"}},
    }


def operations(catalogue: ModelCatalogue | None, settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """(path, method) -> the parts of the operation FastAPI cannot infer."""
    submit = submit_schema(catalogue)
    wait = _query(
        "wait",
        {"type": "number", "minimum": 0, "maximum": settings.long_poll_max_s},
        "hold the answer up to this many seconds for the task to finish",
    )
    bulk = {
        "type": "object",
        "required": ["tasks"],
        "additionalProperties": False,
        "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": settings.max_bulk_tasks, "items": submit}},
    }
    policy_change = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {name: _number_schema(name, description) for name, description in TUNABLE.items()},
        "example": {"max_wait_ms": 150},
    }
    selection: dict[str, Any] = {
        "type": "object",
        "properties": {**FILTER_FIELDS, **PAGE_FIELDS, "ids": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": False,
    }
    replay_selection = {**selection, "properties": {**selection["properties"], **DRY_RUN_FIELD}}
    model_param = _query(
        "model",
        {"type": "string", "enum": list(settings.served_models), "default": settings.default_model},
        "the model whose batching this is (GET /v1/models); unknown: 422 unknown_model",
    )
    filters = [_query(name, schema) for name, schema in FILTER_FIELDS.items()]
    paged = filters + [_query(name, schema) for name, schema in PAGE_FIELDS.items()]
    return {
        ("/v1/tasks", "post"): {
            "requestBody": {"required": True, **_json(submit)},
            "parameters": [
                wait,
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "minLength": 1, "maxLength": IDEMPOTENCY_KEY_MAX_LENGTH},
                },
            ],
            "responses": _responses(
                {
                    202: ("Accepted and durably queued.", ACCEPTED),
                    200: (
                        "Finished within ?wait, or the earlier task of this Idempotency-Key.",
                        {**TASK_STATE, "required": ["task_id", "status"]},
                    ),
                },
                (400, 401, 403, 408, 409, 413, 422, 429, 503),
            ),
        },
        ("/v1/tasks:batch", "post"): {
            "requestBody": {"required": True, **_json(bulk)},
            "responses": _responses(
                {200: ("Ids in order; per-item errors.", _OBJECT)}, (400, 401, 403, 408, 413, 422, 429, 503)
            ),
        },
        ("/v1/tasks/{task_id}", "get"): {
            "parameters": [wait],
            "responses": _responses({200: ("The task.", TASK_STATE)}, (400, 401, 403, 404, 429, 503)),
        },
        ("/v1/tasks/{task_id}", "delete"): {
            "responses": _responses({200: ("Cancelled.", ACCEPTED)}, (400, 401, 403, 404, 409, 429, 503)),
        },
        ("/v1/models", "get"): {"responses": _responses({200: ("The models served.", MODELS)}, (401, 403, 503))},
        ("/v1/models/{model}", "get"): {
            "responses": _responses({200: ("The model.", OPENAI_MODEL)}, (401, 403, 404, 503)),
        },
        (EMBEDDINGS_PATH, "post"): {
            "requestBody": {"required": True, **_json(embedding_request_schema(catalogue, settings.max_bulk_tasks))},
            "responses": _responses(
                {200: ("A vector for each input, in order, and usage (OpenAI's schema).", _OBJECT)},
                (400, 401, 403, 404, 408, 413, 429, 502, 503, 504),
            ),
        },
        ("/v1/stats", "get"): {
            "parameters": [model_param],
            "responses": _responses({200: ("One model's totals and live batchers.", _OBJECT)}, (401, 403, 422, 503)),
        },
        ("/v1/admin/policy", "get"): {
            "parameters": [model_param],
            "responses": _responses({200: ("Values, defaults, history.", _OBJECT)}, (401, 403, 422, 503)),
        },
        ("/v1/admin/policy", "patch"): {
            "parameters": [model_param],
            "requestBody": {"required": True, **_json(policy_change)},
            "responses": _responses({200: ("Old and new values.", _OBJECT)}, (400, 401, 403, 408, 413, 422, 503)),
        },
        ("/healthz", "get"): {"responses": _responses({200: ("Alive.", _OBJECT)}, ())},
        ("/readyz", "get"): {"responses": _responses({200: ("Ready.", _OBJECT), 503: ("Not ready.", _OBJECT)}, ())},
        ("/v1/admin/dlq", "get"): {
            "parameters": paged,
            "responses": _responses(
                {
                    200: (
                        "A page of entries and the next cursor; the first page counts every match by error class.",
                        _OBJECT,
                    )
                },
                (401, 403, 422, 503),
            ),
        },
        ("/v1/admin/dlq/export", "get"): {
            "parameters": filters,
            "responses": {
                "200": {
                    "description": "A Parquet file.",
                    "content": {"application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}}},
                },
                **_responses({}, (401, 403, 422, 503)),
            },
        },
        ("/v1/admin/dlq/{entry}", "get"): {
            "responses": _responses({200: ("The entry in full.", _OBJECT)}, (401, 403, 404, 503)),
        },
        ("/v1/admin/dlq/replay", "post"): {
            "requestBody": {"required": True, **_json(replay_selection)},
            "responses": _responses(
                {200: ("A page's replayed task ids and the next cursor.", _OBJECT)}, (400, 401, 403, 408, 413, 422, 503)
            ),
        },
        ("/v1/admin/dlq/purge", "post"): {
            "requestBody": {"required": True, **_json(selection)},
            "responses": _responses(
                {200: ("A page's purged entry ids and the next cursor.", _OBJECT)}, (400, 401, 403, 408, 413, 422, 503)
            ),
        },
    }


def install(app: FastAPI, settings: Settings, catalogue: Callable[[], ModelCatalogue | None]) -> None:
    """Make ``app.openapi()`` return the full document (rebuilt once the catalogue is known)."""
    cache: dict[str, Any] = {}

    def document() -> dict[str, Any]:
        current = catalogue()
        if cache.get("catalogue") is current and "document" in cache:
            return cache["document"]
        base = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        base.setdefault("components", {}).setdefault("schemas", {})["Error"] = _ERROR
        base["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for (path, method), parts in operations(current, settings).items():
            operation = base["paths"].get(path, {}).get(method)
            if operation is None:
                continue
            parts = deepcopy(parts)
            # Keep the path parameters FastAPI found; add the ones stated here.
            parts["parameters"] = operation.get("parameters", []) + parts.get("parameters", [])
            operation.update(parts)
            if not path.startswith(("/healthz", "/readyz")):
                operation["security"] = [{"bearer": []}]
        cache.update(catalogue=current, document=base)
        return base

    app.openapi = document  # type: ignore[method-assign]


def _number_schema(name: str, description: str) -> dict[str, Any]:
    """A tunable knob's schema, with the bounds PATCH /v1/admin/policy enforces."""
    limits = bounds(name)
    low = "minimum" if limits.low_included else "exclusiveMinimum"
    return {"type": "number", low: limits.low, "maximum": limits.high, "description": description}

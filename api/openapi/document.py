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

from brimful.api.admin.dlq_routes import DRY_RUN_FIELD, FILTER_FIELDS, PAGE_FIELDS
from brimful.api.openapi.openai_operations import openai_operations
from brimful.api.openapi.shapes import (
    ACCEPTED,
    ERROR,
    IDEMPOTENCY_KEY_HEADER,
    MODELS,
    OBJECT,
    TASK_STATE,
    json_content,
    query_parameter,
    responses,
)
from brimful.api.tasks.bulk_arrow import ARROW_STREAM
from brimful.api.tasks.submission import ALLOWED_FIELDS, MAX_DEADLINE_MS, PRIORITIES
from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec
from brimful.core.policy_params import TUNABLE, bounds
from brimful.core.settings import Settings
from brimful.core.webhook_targets import MAX_URL_LENGTH


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
        "callback_url": {
            "type": "string",
            "maxLength": MAX_URL_LENGTH,
            "description": "where the task's final state is POSTed, signed as Standard Webhooks says "
            "(docs/webhooks.md); not inside this network",
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
    return {**_task_operations(catalogue, settings), **_operator_operations(settings), **_dead_letter_operations()}


def _task_operations(catalogue: ModelCatalogue | None, settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """``/v1/tasks``: submit one or many, read, cancel."""
    submit = submit_schema(catalogue)
    wait = query_parameter(
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
    return {
        ("/v1/tasks", "post"): {
            "requestBody": {"required": True, **json_content(submit)},
            "parameters": [wait, IDEMPOTENCY_KEY_HEADER],
            "responses": responses(
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
            "requestBody": {
                "required": True,
                "content": {
                    **json_content(bulk)["content"],
                    ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "parameters": [
                query_parameter(
                    "model", {"type": "string"}, "Arrow body: the model of every row (default: the default)"
                ),
                query_parameter("priority", {"type": "string", "enum": list(PRIORITIES)}, "Arrow body: every row's"),
            ],
            "responses": responses(
                {200: ("Ids in order; per-item errors.", OBJECT)}, (400, 401, 403, 408, 413, 422, 429, 503)
            ),
        },
        ("/v1/tasks/{task_id}", "get"): {
            "parameters": [wait],
            "responses": responses({200: ("The task.", TASK_STATE)}, (400, 401, 403, 404, 429, 503)),
        },
        ("/v1/tasks/{task_id}", "delete"): {
            "responses": responses({200: ("Cancelled.", ACCEPTED)}, (400, 401, 403, 404, 409, 429, 503)),
        },
    }


def _operator_operations(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """The models, one model's stats and live policy, the probes."""
    policy_change = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {name: _number_schema(name, description) for name, description in TUNABLE.items()},
        "example": {"max_wait_ms": 150},
    }
    model_param = query_parameter(
        "model",
        {"type": "string", "enum": list(settings.served_models), "default": settings.default_model},
        "the model whose batching this is (GET /v1/models); unknown: 422 unknown_model",
    )
    return {
        ("/v1/models", "get"): {"responses": responses({200: ("The models served.", MODELS)}, (401, 403, 503))},
        ("/v1/stats", "get"): {
            "parameters": [model_param],
            "responses": responses({200: ("One model's totals and live batchers.", OBJECT)}, (401, 403, 422, 503)),
        },
        ("/v1/admin/policy", "get"): {
            "parameters": [model_param],
            "responses": responses({200: ("Values, defaults, history.", OBJECT)}, (401, 403, 422, 503)),
        },
        ("/v1/admin/policy", "patch"): {
            "parameters": [model_param],
            "requestBody": {"required": True, **json_content(policy_change)},
            "responses": responses({200: ("Old and new values.", OBJECT)}, (400, 401, 403, 408, 413, 422, 503)),
        },
        ("/healthz", "get"): {"responses": responses({200: ("Alive.", OBJECT)}, ())},
        ("/readyz", "get"): {"responses": responses({200: ("Ready.", OBJECT), 503: ("Not ready.", OBJECT)}, ())},
    }


def _dead_letter_operations() -> dict[tuple[str, str], dict[str, Any]]:
    """``/v1/admin/dlq``: list, export, show, replay, purge."""
    selection: dict[str, Any] = {
        "type": "object",
        "properties": {**FILTER_FIELDS, **PAGE_FIELDS, "ids": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": False,
    }
    replay_selection = {**selection, "properties": {**selection["properties"], **DRY_RUN_FIELD}}
    filters = [query_parameter(name, schema) for name, schema in FILTER_FIELDS.items()]
    paged = filters + [query_parameter(name, schema) for name, schema in PAGE_FIELDS.items()]
    return {
        ("/v1/admin/dlq", "get"): {
            "parameters": paged,
            "responses": responses(
                {
                    200: (
                        "A page of entries and the next cursor; the first page counts every match by error class.",
                        OBJECT,
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
                **responses({}, (401, 403, 422, 503)),
            },
        },
        ("/v1/admin/dlq/{entry}", "get"): {
            "responses": responses({200: ("The entry in full.", OBJECT)}, (401, 403, 404, 503)),
        },
        ("/v1/admin/dlq/replay", "post"): {
            "requestBody": {"required": True, **json_content(replay_selection)},
            "responses": responses(
                {200: ("A page's replayed task ids and the next cursor.", OBJECT)}, (400, 401, 403, 408, 413, 422, 503)
            ),
        },
        ("/v1/admin/dlq/purge", "post"): {
            "requestBody": {"required": True, **json_content(selection)},
            "responses": responses(
                {200: ("A page's purged entry ids and the next cursor.", OBJECT)}, (400, 401, 403, 408, 413, 422, 503)
            ),
        },
    }


def install(app: FastAPI, settings: Settings, catalogue: Callable[[], ModelCatalogue | None]) -> None:
    """Make ``app.openapi()`` return the full document (rebuilt once the catalogue is known)."""
    cache: dict[str, Any] = {}

    def document() -> dict[str, Any]:
        current = catalogue()
        if cache.get("catalogue") is current and "document" in cache:
            cached: dict[str, Any] = cache["document"]
            return cached
        base = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        base.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
        base["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for (path, method), parts in {**operations(current, settings), **openai_operations(current, settings)}.items():
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

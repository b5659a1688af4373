"""The OpenAPI operations of the OpenAI-compatible routes (embeddings, models, files,
batches) and of the webhooks, with the limits they show imported from where they are
enforced."""

from __future__ import annotations

from typing import Any

from brimful.api.jobs.job_lines import ENDPOINTS
from brimful.api.jobs.job_routes import BATCH_BODY, BATCHES_PATH, EXPIRES_AFTER
from brimful.api.jobs.job_routes import (
    LIST_LIMIT_MAX as BATCH_LIST_MAX,
)
from brimful.api.jobs.result_tables import FORMATS as TABLE_FORMATS
from brimful.api.openai.embedding_request import EMBEDDINGS_PATH, embedding_request_schema
from brimful.api.openai.file_routes import FILES_PATH
from brimful.api.openai.file_routes import LIST_LIMIT_MAX as FILE_LIST_MAX
from brimful.api.openapi.shapes import (
    IDEMPOTENCY_KEY_HEADER,
    OBJECT,
    OPENAI_MODEL,
    json_content,
    query_parameter,
    responses,
)
from brimful.api.webhooks.webhook_routes import ENDPOINT_BODY, RECOVER_BODY, WEBHOOKS_PATH
from brimful.api.webhooks.webhook_routes import LIST_LIMIT_MAX as WEBHOOK_LIST_MAX
from brimful.core.batch_status import BatchStatus
from brimful.core.file_records import (
    OUTPUT_PURPOSE,
    UPLOAD_PURPOSES,
)
from brimful.core.model_catalogue import ModelCatalogue
from brimful.core.settings import Settings
from brimful.core.webhook_targets import MAX_URL_LENGTH

FILE = {
    "type": "object",
    "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["file"]},
        "bytes": {"type": "integer"},
        "created_at": {"type": "integer"},
        "expires_at": {"type": ["integer", "null"], "description": "when it is removed (Unix seconds); null: kept"},
        "filename": {"type": "string"},
        "purpose": {"type": "string", "enum": [*UPLOAD_PURPOSES, OUTPUT_PURPOSE]},
    },
}
BATCH = {
    "type": "object",
    "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status", "request_counts"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["batch"]},
        "endpoint": {"type": "string", "enum": list(ENDPOINTS)},
        "status": {"type": "string", "enum": [status.value for status in BatchStatus]},
        "request_counts": {
            "type": "object",
            "properties": {name: {"type": "integer"} for name in ("total", "completed", "failed")},
        },
        "model": {"type": ["string", "null"], "description": "the model its lines run on; null before one runs"},
        "usage": {
            "type": "object",
            "description": "input_tokens: what its completed lines counted (an embeddings answer's prompt_tokens; "
            "a /v1/tasks line counts none); output_tokens 0",
            "properties": {name: {"type": "integer"} for name in ("input_tokens", "output_tokens", "total_tokens")},
        },
    },
}


def _page(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"type": "string"},
            "data": {"type": "array", "items": item},
            "has_more": {"type": "boolean"},
        },
    }


def openai_operations(catalogue: ModelCatalogue | None, settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """(path, method) -> the parts of each OpenAI-compatible operation FastAPI cannot infer."""
    return {
        ("/v1/models/{model}", "get"): {
            "responses": responses({200: ("The model.", OPENAI_MODEL)}, (401, 403, 404, 503)),
        },
        (EMBEDDINGS_PATH, "post"): {
            "requestBody": {
                "required": True,
                **json_content(embedding_request_schema(catalogue, settings.max_bulk_tasks)),
            },
            "responses": responses(
                {200: ("A vector for each input, in order, and usage (OpenAI's schema).", OBJECT)},
                (400, 401, 403, 404, 408, 413, 429, 502, 503, 504),
            ),
        },
        **_file_operations(settings),
        **_batch_operations(),
        **_webhook_operations(),
    }


def _limit(most: int) -> dict[str, Any]:
    return query_parameter("limit", {"type": "integer", "minimum": 1, "maximum": most})


AFTER = query_parameter("after", {"type": "string"}, "the id of the last item of the page before")


def _file_operations(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """``/v1/files``: upload, list, retrieve, delete, download."""
    upload = {
        "type": "object",
        "required": ["file", "purpose"],
        "properties": {
            "file": {"type": "string", "format": "binary", "description": f"at most {settings.file_max_bytes} bytes"},
            "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
            "expires_after[anchor]": EXPIRES_AFTER["properties"]["anchor"],
            "expires_after[seconds]": EXPIRES_AFTER["properties"]["seconds"],
        },
    }
    return {
        (FILES_PATH, "post"): {
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": upload}}},
            "parameters": [IDEMPOTENCY_KEY_HEADER],
            "responses": responses({200: ("The file.", FILE)}, (400, 401, 403, 408, 413, 415, 429, 503)),
        },
        (FILES_PATH, "get"): {
            "parameters": [
                _limit(FILE_LIST_MAX),
                AFTER,
                query_parameter("order", {"type": "string", "enum": ["asc", "desc"]}),
                query_parameter("purpose", {"type": "string", "enum": [*UPLOAD_PURPOSES, OUTPUT_PURPOSE]}),
            ],
            "responses": responses({200: ("A page of the tenant's files.", _page(FILE))}, (400, 401, 403, 503)),
        },
        (FILES_PATH + "/{file_id}", "get"): {
            "responses": responses({200: ("The file.", FILE)}, (401, 403, 404, 503)),
        },
        (FILES_PATH + "/{file_id}", "delete"): {
            "responses": responses({200: ("Deleted.", OBJECT)}, (401, 403, 404, 503)),
        },
        (FILES_PATH + "/{file_id}/content", "get"): {
            "parameters": [
                query_parameter(
                    "format", {"type": "string", "enum": list(TABLE_FORMATS)}, "a batch job's results as a table"
                )
            ],
            "responses": {
                "200": {
                    "description": "The file's bytes (or, with format, a batch job's results as a table).",
                    "content": {
                        media: {"schema": {"type": "string", "format": "binary"}}
                        for media in ("application/octet-stream", *TABLE_FORMATS.values())
                    },
                },
                **responses({}, (400, 401, 403, 404, 503)),
            },
        },
    }


def _batch_operations() -> dict[tuple[str, str], dict[str, Any]]:
    """``/v1/batches``: create, list, retrieve, cancel."""
    return {
        (BATCHES_PATH, "post"): {
            "requestBody": {"required": True, **json_content(BATCH_BODY.schema)},
            "parameters": [IDEMPOTENCY_KEY_HEADER],
            "responses": responses({200: ("The batch, validating.", BATCH)}, (400, 401, 403, 404, 408, 413, 429, 503)),
        },
        (BATCHES_PATH, "get"): {
            "parameters": [_limit(BATCH_LIST_MAX), AFTER],
            "responses": responses({200: ("A page of the tenant's batches.", _page(BATCH))}, (400, 401, 403, 503)),
        },
        (BATCHES_PATH + "/{batch_id}", "get"): {
            "responses": responses({200: ("The batch.", BATCH)}, (401, 403, 404, 503)),
        },
        (BATCHES_PATH + "/{batch_id}/retry", "post"): {
            "parameters": [IDEMPOTENCY_KEY_HEADER],
            "responses": responses(
                {200: ("Brimful's: a new job over the ended job's failed lines (retry_of names it).", BATCH)},
                (401, 403, 404, 409, 413, 429, 503),
            ),
        },
        (BATCHES_PATH + "/{batch_id}/results", "get"): {
            "parameters": [query_parameter("file", {"type": "string", "enum": ["output", "errors"]})],
            "responses": {
                "200": {
                    "description": "Brimful's: the job's output (or error) lines written so far, JSONL.",
                    "content": {"application/jsonl": {"schema": {"type": "string", "format": "binary"}}},
                },
                **responses({}, (400, 401, 403, 404, 503)),
            },
        },
        (BATCHES_PATH + "/{batch_id}/cancel", "post"): {
            "responses": responses({200: ("The batch, cancelling.", BATCH)}, (401, 403, 404, 409, 503)),
        },
    }


def _webhook_operations() -> dict[tuple[str, str], dict[str, Any]]:
    """``/v1/webhooks``: endpoints, the callback secret, deliveries."""
    return {
        (WEBHOOKS_PATH + "/endpoints", "post"): {
            "requestBody": {"required": True, **json_content(ENDPOINT_BODY.schema)},
            "responses": responses({200: ("The endpoint, with its secret.", OBJECT)}, (400, 401, 403, 408, 413, 503)),
        },
        (WEBHOOKS_PATH + "/endpoints", "get"): {
            "responses": responses({200: ("The tenant's endpoints.", OBJECT)}, (401, 403, 503)),
        },
        (WEBHOOKS_PATH + "/endpoints/{endpoint_id}", "delete"): {
            "responses": responses({200: ("Deleted.", OBJECT)}, (401, 403, 404, 503)),
        },
        (WEBHOOKS_PATH + "/endpoints/{endpoint_id}/rotate-secret", "post"): {
            "responses": responses(
                {200: ("The endpoint with its new secret; the old one signs beside it a while.", OBJECT)},
                (401, 403, 404, 503),
            ),
        },
        (WEBHOOKS_PATH + "/endpoints/{endpoint_id}/recover", "post"): {
            "requestBody": {"required": True, **json_content(RECOVER_BODY.schema)},
            "responses": responses(
                {200: ("The dead deliveries sent again.", OBJECT)}, (400, 401, 403, 404, 408, 409, 413, 503)
            ),
        },
        (WEBHOOKS_PATH + "/endpoints/{endpoint_id}/enable", "post"): {
            "responses": responses({200: ("The endpoint, enabled.", OBJECT)}, (401, 403, 404, 503)),
        },
        (WEBHOOKS_PATH + "/callback-secret", "get"): {
            "parameters": [
                query_parameter(
                    "url", {"type": "string", "maxLength": MAX_URL_LENGTH}, "a callback URL: its origin's secret"
                )
            ],
            "responses": responses(
                {200: ("The secret of the tenant's task callbacks to that origin.", OBJECT)}, (400, 401, 403, 503)
            ),
        },
        (WEBHOOKS_PATH + "/deliveries", "get"): {
            "parameters": [
                _limit(WEBHOOK_LIST_MAX),
                query_parameter("state", {"type": "string", "enum": ["dead"]}, "dead: the dead ones only"),
            ],
            "responses": responses({200: ("The tenant's latest deliveries.", OBJECT)}, (400, 401, 403, 503)),
        },
        (WEBHOOKS_PATH + "/deliveries/{delivery_id}", "get"): {
            "responses": responses({200: ("The delivery and its event.", OBJECT)}, (401, 403, 404, 503)),
        },
        (WEBHOOKS_PATH + "/deliveries/{delivery_id}/replay", "post"): {
            "responses": responses({200: ("The delivery, pending.", OBJECT)}, (401, 403, 404, 409, 503)),
        },
    }

"""Bodies declared once (api/http/body_schema.py): the schemas the OpenAPI document shows
are the ones the routes hold bodies to, and every misfit answers 400 naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from brimful.api.http.bodies import ApiError
from brimful.api.jobs.job_routes import BATCH_BODY, MAX_METADATA, MAX_METADATA_VALUE
from brimful.api.webhooks.webhook_routes import ENDPOINT_BODY, MAX_DESCRIPTION
from brimful.core.settings import Settings

GOOD_JOB = {"input_file_id": "file-1", "endpoint": "/v1/tasks", "completion_window": "24h"}
GOOD_ENDPOINT = {"url": "https://example.com/hook", "events": ["batch.completed"]}


def refusal(schema: Any, document: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        schema.check(document)
    assert refused.value.status == 400
    return refused.value


@pytest.mark.parametrize(
    ("changes", "param", "says"),
    [
        ({"priority": "high"}, None, "unknown field(s) in body: priority; allowed: input_file_id"),
        ({"endpoint": "/v1/chat/completions"}, "endpoint", "endpoint must be one of: /v1/embeddings, /v1/tasks"),
        ({"completion_window": 24}, "completion_window", "completion_window must be a string"),
        ({"completion_window": "soon"}, "completion_window", "completion_window: must match"),
        ({"metadata": {f"k{n}": "v" for n in range(MAX_METADATA + 1)}}, "metadata", f"at most {MAX_METADATA} pairs"),
        ({"metadata": {"k": "v" * (MAX_METADATA_VALUE + 1)}}, "metadata.k", f"at most {MAX_METADATA_VALUE} char"),
        ({"metadata": {"k": 1}}, "metadata.k", "metadata.k must be a string"),
        ({"output_expires_after": {"anchor": "now", "seconds": 3600}}, "output_expires_after.anchor", "created_at"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 60}}, "output_expires_after.seconds", "least"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": "²"}}, "output_expires_after.seconds", "whole"),
        ({"output_expires_after": {"anchor": "created_at"}}, "output_expires_after.seconds", "is required"),
    ],
)
def test_a_job_body_that_does_not_fit_names_its_field(changes: dict[str, Any], param: str | None, says: str) -> None:
    error = refusal(BATCH_BODY, {**GOOD_JOB, **changes})
    assert says in error.message and error.param == param, (error.message, error.param)


def test_a_missing_field_names_itself_and_what_it_is() -> None:
    error = refusal(BATCH_BODY, {"endpoint": "/v1/tasks", "completion_window": "24h"})
    assert error.param == "input_file_id"
    assert error.message == "input_file_id is required: the id of a file uploaded with purpose batch"


@pytest.mark.parametrize("document", [[GOOD_JOB], "24h", None, 7])
def test_a_body_that_is_not_an_object_is_refused_as_the_body(document: Any) -> None:
    error = refusal(BATCH_BODY, document)
    assert error.message == "body must be an object" and error.param is None


def test_a_fitting_body_comes_back_as_it_was() -> None:
    body = {**GOOD_JOB, "metadata": {"ключ": "значение"}, "output_expires_after": None}
    assert BATCH_BODY.check(body) is body
    assert ENDPOINT_BODY.check(GOOD_ENDPOINT) is GOOD_ENDPOINT


@pytest.mark.parametrize(
    ("changes", "param", "says"),
    [
        ({"events": []}, "events", "at least 1 items"),
        ({"events": ["batch.exploded"]}, "events.0", "events.0 must be one of: task.completed, task.failed"),
        ({"url": None}, "url", "url must be a string"),
        ({"description": "é" * (MAX_DESCRIPTION + 1)}, "description", f"at most {MAX_DESCRIPTION} characters"),
        ({"secret": "mine"}, None, "unknown field(s) in body: secret"),
    ],
)
def test_an_endpoint_body_that_does_not_fit_names_its_field(
    changes: dict[str, Any], param: str | None, says: str
) -> None:
    error = refusal(ENDPOINT_BODY, {**GOOD_ENDPOINT, **changes})
    assert says in error.message and error.param == param, (error.message, error.param)


def test_the_document_shows_the_schemas_the_routes_check() -> None:
    from brimful.api.openapi.openai_operations import openai_operations

    operations = openai_operations(None, Settings())
    for (path, method), schema in (
        (("/v1/batches", "post"), BATCH_BODY.schema),
        (("/v1/webhooks/endpoints", "post"), ENDPOINT_BODY.schema),
    ):
        shown = operations[(path, method)]["requestBody"]["content"]["application/json"]["schema"]
        assert shown is schema

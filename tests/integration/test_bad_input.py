"""Bad input gets a 4xx naming the problem, never a 5xx, and harms nothing accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.task_client import TaskClient


async def post_raw(client: TaskClient, body: bytes | Any, content_type: str = "application/json") -> tuple[int, Any]:
    return await client.request("POST", "/v1/tasks", data=body, headers={"Content-Type": content_type})


def assert_error(status: int, body: Any, expected_status: int, code: str, *mentions: str) -> None:
    assert status == expected_status, body
    assert body["error"]["code"] == code, body
    for mention in mentions:
        assert mention in body["error"]["message"], body


async def test_invalid_json_is_400(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {"TEXT": "unterminated}')
    assert_error(status, body, 400, "invalid_json", "not valid JSON", "line 1")


async def test_body_that_is_not_utf8_is_400(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {"TEXT": "\xff\xfe"}}')
    assert_error(status, body, 400, "invalid_json", "UTF-8")


async def test_text_with_a_lone_surrogate_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {"TEXT": "\\ud800"}}')
    assert_error(status, body, 422, "invalid_input", "TEXT", "not valid Unicode")


async def test_empty_body_is_400(client: TaskClient) -> None:
    status, body = await post_raw(client, b"")
    assert_error(status, body, 400, "invalid_json")


@pytest.mark.parametrize("document", [b"[]", b'"TEXT"', b"42", b"null"])
async def test_body_that_is_not_an_object_is_422(client: TaskClient, document: bytes) -> None:
    status, body = await post_raw(client, document)
    assert_error(status, body, 422, "invalid_request", "JSON object")


async def test_missing_inputs_object_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"TEXT": "hello"}')
    assert_error(status, body, 422, "invalid_request", "TEXT")  # names the stray field


async def test_inputs_that_is_not_an_object_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": ["hello"]}')
    assert_error(status, body, 422, "invalid_request", '"inputs" object')


async def test_unknown_top_level_field_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {"TEXT": "x"}, "priority": 3}')
    assert_error(status, body, 422, "invalid_request", "priority")


async def test_missing_input_name_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {}}')
    assert_error(status, body, 422, "missing_input", "TEXT")


async def test_unknown_input_name_is_422(client: TaskClient) -> None:
    status, body = await post_raw(client, b'{"inputs": {"TEXT": "x", "IMAGE": "y"}}')
    assert_error(status, body, 422, "unknown_input", "IMAGE", "TEXT")


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("5", "an integer"),
        ("null", "null"),
        ("true", "a boolean"),
        ('{"a": 1}', "an object"),
        ("1.5", "a number"),
        ('["a", "b"]', "a list of 2"),
        ('[["a"]]', "a list"),
    ],
)
async def test_wrong_input_type_is_422(client: TaskClient, value: str, got: str) -> None:
    status, body = await post_raw(client, f'{{"inputs": {{"TEXT": {value}}}}}'.encode())
    assert_error(status, body, 422, "invalid_input", "TEXT", got)


async def test_body_over_the_limit_is_413(stack: EmbeddedStack, client: TaskClient) -> None:
    limit = stack.settings.max_body_bytes
    text = "x" * (limit - len('{"inputs": {"TEXT": ""}}') + 1)
    status, body = await post_raw(client, f'{{"inputs": {{"TEXT": "{text}"}}}}'.encode())
    assert_error(status, body, 413, "body_too_large", str(limit))


async def test_chunked_body_over_the_limit_is_413(stack: EmbeddedStack, client: TaskClient) -> None:
    # No Content-Length: the limit must hold while the body streams in.
    limit = stack.settings.max_body_bytes

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"inputs": {"TEXT": "'
        for _ in range(limit // 65536 + 2):
            yield b"y" * 65536
        yield b'"}}'

    status, body = await post_raw(client, chunks())
    assert_error(status, body, 413, "body_too_large", str(limit))


@pytest.mark.parametrize("path", ["/v1/admin/dlq/replay", "/v1/admin/dlq/purge"])
async def test_a_dlq_job_body_over_the_limit_is_413(stack: EmbeddedStack, client: TaskClient, path: str) -> None:
    # On-call's routes read their bodies under the same bound as a task's.
    limit = stack.settings.max_body_bytes
    ids = ",".join(['"' + "0" * 30 + '"'] * (limit // 32 + 1))
    status, body = await client.request(
        "POST", path, data=f'{{"ids": [{ids}]}}'.encode(), headers={"Content-Type": "application/json"}
    )
    assert_error(status, body, 413, "body_too_large", str(limit))


async def test_body_just_under_the_limit_is_accepted(stack: EmbeddedStack, client: TaskClient) -> None:
    limit = stack.settings.max_body_bytes
    text = "z" * (limit - len('{"inputs": {"TEXT": ""}}'))
    status, body = await post_raw(client, f'{{"inputs": {{"TEXT": "{text}"}}}}'.encode())
    assert status == 202, body
    task = await client.wait_final(body["task_id"])
    assert task["outputs"] == expected_outputs(text)


@pytest.mark.parametrize(
    "task_id", ["abc", "X" * 32, "0" * 31, "0" * 33, "g" * 32, "12345678-1234-1234-1234-123456789abc"]
)
async def test_malformed_task_id_is_400(client: TaskClient, task_id: str) -> None:
    status, body = await client.request("GET", f"/v1/tasks/{task_id}")
    assert_error(status, body, 400, "malformed_task_id")


async def test_unknown_task_id_is_404(client: TaskClient) -> None:
    status, body = await client.request("GET", f"/v1/tasks/{'0' * 32}")
    assert_error(status, body, 404, "task_not_found", "0" * 32)


async def test_wrong_method_is_405_and_says_what_is_allowed(client: TaskClient) -> None:
    async with client.session.request("PUT", "/v1/tasks") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_bad_input_harms_nothing_already_accepted(client: TaskClient) -> None:
    accepted = [await client.submit({"TEXT": f"keep me {i}"}) for i in range(5)]
    bad_bodies = [b"{", b"[]", b'{"inputs": {}}', b'{"inputs": {"TEXT": 1}}', b'{"inputs": {"NOPE": "x"}}']
    answers = await asyncio.gather(*(post_raw(client, body) for body in bad_bodies * 10))
    assert all(400 <= status < 500 for status, _ in answers)
    for index, task_id in enumerate(accepted):
        task = await client.wait_final(task_id)
        assert task["status"] == "done"
        assert task["outputs"] == expected_outputs(f"keep me {index}")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"inputs": {"TEXT": ' + b"7" * 5000 + b"}}", "number"),  # Python refuses ints of over 4,300 digits
        (b'{"inputs": {"TEXT": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", "deeply"),
        (b'{"inputs": {"TEXT": "x"}, "deadline_ms": ' + b"9" * 4400 + b"}", "number"),
    ],
    ids=["huge-integer", "deep-nesting", "huge-deadline"],
)
async def test_json_python_cannot_read_is_400_not_500(client: TaskClient, body: bytes, says: str) -> None:
    status, answer = await post_raw(client, body)
    assert_error(status, answer, 400, "invalid_json", says)
    status, answer = await client.request(
        "POST", "/v1/tasks:batch", data=b'{"tasks": [' + body + b"]}", headers={"Content-Type": "application/json"}
    )
    assert_error(status, answer, 400, "invalid_json", says)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"max_wait_ms": ' + b"1" * 5000 + b"}", 400, "invalid_json"),
        (b'{"max_wait_ms": 1' + b"0" * 400 + b"}", 422, "invalid_policy"),  # an int no float can hold
        (b'{"max_wait_ms": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 400, "invalid_json"),
    ],
    ids=["huge-integer", "overflowing-integer", "deep-nesting"],
)
async def test_policy_changes_python_cannot_read_are_4xx(
    client: TaskClient, body: bytes, status: int, code: str
) -> None:
    answer_status, answer = await client.request(
        "PATCH", "/v1/admin/policy", data=body, headers={"Content-Type": "application/json"}
    )
    assert_error(answer_status, answer, status, code)

"""A web page cannot drive an open (auth off) stack through its visitor's browser: a
foreign ``Host`` is refused (DNS rebinding), a write from another origin is refused, and a
body that says it is not JSON is refused, before any route runs; programs and same-origin
pages are served as before. On the shared stack, which runs open as `brimful up` does."""

from __future__ import annotations

import uuid

import aiohttp
import pytest

from brimful.api.http.guards import host_name, is_page_type
from brimful.stack import EmbeddedStack
from tests.helpers.stacks import rows_seen_by_model
from tests.helpers.task_client import TaskClient

FOREIGN = "http://evil.example"


async def raw(
    stack: EmbeddedStack, method: str, path: str, headers: dict[str, str], data: bytes = b""
) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{stack.api_url}{path}", headers=headers, data=data) as response:
            return response.status, await response.json(content_type=None)


async def test_a_cross_origin_text_post_submits_nothing(stack: EmbeddedStack, client: TaskClient) -> None:
    text = f"from a page {uuid.uuid4().hex}"
    body = f'{{"inputs": {{"TEXT": "{text}"}}}}'.encode()
    status, answer = await raw(stack, "POST", "/v1/tasks", {"Origin": FOREIGN, "Content-Type": "text/plain"}, body)
    assert status == 403 and answer["error"]["code"] == "cross_origin", answer
    status, answer = await raw(
        stack,
        "POST",
        "/v1/tasks:batch",
        {"Origin": FOREIGN, "Content-Type": "application/json"},
        f'{{"tasks": [{{"inputs": {{"TEXT": "{text}"}}}}]}}'.encode(),
    )
    assert status == 403 and answer["error"]["code"] == "cross_origin", answer
    status, answer = await raw(
        stack, "POST", "/v1/admin/dlq/purge", {"Origin": FOREIGN, "Content-Type": "text/plain"}, b'{"ids": ["x"]}'
    )
    assert status == 403 and answer["error"]["code"] == "cross_origin", answer
    # A task sent after them is computed; the refused ones never reached the model.
    after = await client.submit({"TEXT": f"after the page {uuid.uuid4().hex}"})
    assert (await client.wait_final(after))["status"] == "done"
    assert text not in rows_seen_by_model(stack)


async def test_a_body_that_is_not_json_is_415_naming_the_type_to_send(stack: EmbeddedStack) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, answer = await raw(
            stack, "POST", "/v1/tasks", {"Content-Type": content_type}, b'{"inputs": {"TEXT": "x"}}'
        )
        assert status == 415 and answer["error"]["code"] == "unsupported_media_type", answer
        assert "application/json" in answer["error"]["message"]
    status, answer = await raw(
        stack, "PATCH", "/v1/admin/policy", {"Content-Type": "text/plain"}, b'{"max_wait_ms": 1}'
    )
    assert status == 415, answer


async def test_a_foreign_host_is_refused_and_loopback_names_are_served(stack: EmbeddedStack) -> None:
    port = stack.settings.api_port
    for path in ("/v1/admin/dlq", "/v1/admin/policy", "/v1/stats", f"/v1/tasks/{uuid.uuid4().hex}"):
        status, answer = await raw(stack, "GET", path, {"Host": f"rebound.evil.example:{port}"})
        assert status == 403 and answer["error"]["code"] == "forbidden_host", answer
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        status, answer = await raw(stack, "GET", "/v1/admin/policy", {"Host": host})
        assert status == 200, (host, answer)


async def test_same_origin_pages_and_programs_are_served_and_cors_stays_off(stack: EmbeddedStack) -> None:
    own = f"http://127.0.0.1:{stack.settings.api_port}"
    body = f'{{"inputs": {{"TEXT": "same origin {uuid.uuid4().hex}"}}}}'.encode()
    status, answer = await raw(stack, "POST", "/v1/tasks", {"Origin": own, "Content-Type": "application/json"}, body)
    assert status == 202, answer
    status, answer = await raw(stack, "POST", "/v1/tasks", {"Content-Type": "application/json; charset=utf-8"}, body)
    assert status == 202, answer
    async with (
        aiohttp.ClientSession() as session,
        session.options(
            f"{stack.api_url}/v1/tasks", headers={"Origin": FOREIGN, "Access-Control-Request-Method": "POST"}
        ) as response,
    ):
        assert "access-control-allow-origin" not in response.headers


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:80", "[::1]"),
        ("::1", "::1"),
        ("evil.example:1", "evil.example"),
        ("", ""),
    ],
)
def test_host_names_lose_their_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_page_types_are_the_ones_a_page_sends_without_asking() -> None:
    assert is_page_type("text/plain") and is_page_type("Text/Plain; charset=utf-8") and is_page_type("text/json")
    assert is_page_type("application/x-www-form-urlencoded") and is_page_type("multipart/form-data; boundary=x")
    assert not is_page_type("application/json") and not is_page_type("application/octet-stream")
    assert not is_page_type("")


async def test_only_the_upload_route_reads_multipart_and_a_page_still_cannot_upload(stack: EmbeddedStack) -> None:
    boundary = "brimfulboundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="page.jsonl"\r\n\r\n{{}}\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    status, answer = await raw(stack, "POST", "/v1/files", {**multipart, "Origin": FOREIGN}, body)
    assert status == 403 and answer["error"]["code"] == "cross_origin", answer
    status, answer = await raw(stack, "POST", "/v1/batches", multipart, body)
    assert status == 415, answer  # multipart is read on the upload route only
    status, answer = await raw(stack, "POST", "/v1/files", {"Content-Type": "text/plain"}, body)
    assert status == 415, answer
    status, answer = await raw(stack, "POST", "/v1/files", multipart, body)  # a program, no Origin
    assert status == 200 and answer["filename"] == "page.jsonl" and answer["bytes"] == 2, answer

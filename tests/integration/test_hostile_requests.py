"""What a tenant can send that Python reads differently from what it means, against the
production-shape stack (auth on, two API workers): Unicode digits and numbers past any
bound in query parameters and bodies, file names no header can carry, and webhook and
callback addresses that reach this network through an IPv6 spelling. Each answers a 4xx
naming the field, never a 500, and nothing is stored or sent for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import unquote

import httpx
import orjson
import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.polling import wait_for

UNICODE_DIGITS = ["²", "١٠", "٣", "𝟗", "1²", "⁵"]


@pytest.fixture
async def tenant(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['submit']}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
async def admin(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['admin']}"}, timeout=30
    ) as client:
        yield client
        for endpoint in (await client.get("/v1/webhooks/endpoints")).json()["data"]:
            await client.delete(f"/v1/webhooks/endpoints/{endpoint['id']}")


@pytest.mark.parametrize("digits", [*UNICODE_DIGITS, "99999999999999999999999999", "-1", "1.0", " 5", "0x10"])
@pytest.mark.parametrize(
    ("path", "who"),
    [
        ("/v1/files", "tenant"),
        ("/v1/batches", "tenant"),
        ("/v1/webhooks/deliveries", "admin"),
        ("/v1/admin/dlq", "admin"),
    ],
)
async def test_a_list_limit_that_is_not_ascii_digits_is_a_4xx_naming_limit(
    tenant: httpx.AsyncClient, admin: httpx.AsyncClient, path: str, who: str, digits: str
) -> None:
    client = tenant if who == "tenant" else admin
    answer = await client.get(path, params={"limit": digits})
    assert answer.status_code in (400, 422), answer.text
    assert "limit" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("window", ["²h", "١h", "𝟗m", "99999999999999999999h", "-1h", "1.5h", "h"])
async def test_a_completion_window_that_is_not_ascii_digits_is_400(tenant: httpx.AsyncClient, window: str) -> None:
    file_id = await _upload(tenant, b'{"custom_id": "a", "method": "POST", "url": "/v1/tasks", "body": {}}\n')
    answer = await tenant.post(
        "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/tasks", "completion_window": window}
    )
    assert answer.status_code == 400 and "completion_window" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("route", ["/v1/admin/dlq/replay", "/v1/admin/dlq/purge"])
@pytest.mark.parametrize(
    "bound", [b"1e400", b"-1e400", b"1.5", b"true", b'"\xc2\xb2"', b"123456789012345678901234567890"]
)
async def test_dlq_filters_past_any_number_are_422(admin: httpx.AsyncClient, route: str, bound: bytes) -> None:
    body = b'{"since_ms": ' + bound + b', "dry_run": true}'
    answer = await admin.post(route, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "since_ms" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("wait", ["inf", "nan", "1e400", "²", "١"])
async def test_a_long_poll_wait_that_is_not_a_finite_ascii_number_is_400(tenant: httpx.AsyncClient, wait: str) -> None:
    answer = await tenant.post("/v1/tasks", params={"wait": wait}, json={"inputs": {"TEXT": "never accepted"}})
    assert answer.status_code == 400 and "wait" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("résumé – 第一.jsonl", "résumé – 第一.jsonl"),
        ("emoji 🎉.jsonl", "emoji 🎉.jsonl"),
        ("tab\there\x00\x1b[31m\x7f.jsonl", "tabhere[31m.jsonl"),
        ("..\\..\\windows\\path.jsonl", "path.jsonl"),
        ("50%\u202eright-to-left.jsonl", "50%right-to-left.jsonl"),
    ],
)
async def test_any_file_name_is_kept_safely_and_downloads(tenant: httpx.AsyncClient, given: str, kept: str) -> None:
    content = b'{"custom_id": "a"}\n'
    file_id = await _upload(tenant, content, given)
    assert (await tenant.get(f"/v1/files/{file_id}")).json()["filename"] == kept
    download = await tenant.get(f"/v1/files/{file_id}/content")
    assert download.status_code == 200 and download.content == content
    disposition = download.headers["content-disposition"]
    assert disposition.isascii() and "\r" not in disposition and "\n" not in disposition
    if kept.isascii() and "%" not in kept:
        assert disposition == f'attachment; filename="{kept}"'
    else:
        assert unquote(disposition.split("filename*=UTF-8''", 1)[1]) == kept


INWARD_SPELLINGS = [
    "http://[64:ff9b::a00:1]/hook",  # NAT64 to 10.0.0.1
    "http://[64:ff9b::7f00:1]/hook",  # NAT64 to 127.0.0.1
    "http://[64:ff9b:1::808:808]/hook",  # local-use NAT64: never global
    "http://[2002:a9fe:a9fe::1]/hook",  # 6to4 around 169.254.169.254
    "http://[::a00:1]/hook",  # IPv4-compatible 10.0.0.1
    "http://[::7f00:1]/hook",  # IPv4-compatible 127.0.0.1
    "http://[fec0::1]/hook",  # site-local
    "http://[::ffff:a9fe:a9fe]/hook",  # mapped, written in hex
    "http://0x7f000001/hook",  # 127.0.0.1 as one hex number
    "http://2130706433/hook",  # 127.0.0.1 as one decimal number
    "http://0177.0.0.1/hook",  # 127.0.0.1 in octal
]


@pytest.mark.parametrize("url", INWARD_SPELLINGS)
async def test_every_spelling_of_an_inward_address_is_refused_for_a_webhook(admin: httpx.AsyncClient, url: str) -> None:
    answer = await admin.post("/v1/webhooks/endpoints", json={"url": url, "events": ["task.completed"]})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_url", answer.text


@pytest.mark.parametrize("url", INWARD_SPELLINGS[:7])
async def test_every_spelling_of_an_inward_address_is_refused_for_a_callback(
    tenant: httpx.AsyncClient, url: str
) -> None:
    answer = await tenant.post("/v1/tasks", json={"inputs": {"TEXT": "x"}, "callback_url": url})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_callback_url", answer.text


async def test_a_batch_lines_callback_url_is_checked_as_a_submissions_is(tenant: httpx.AsyncClient) -> None:
    """A line whose callback points inward goes to the error file (the job asks to run its
    valid lines); the line beside it runs."""
    lines = [
        {"custom_id": "inward", "method": "POST", "url": "/v1/tasks",
         "body": {"inputs": {"TEXT": "in"}, "callback_url": "http://[64:ff9b::a00:1]/cb"}},
        {"custom_id": "plain", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": "plain line"}}},
    ]  # fmt: skip
    file_id = await _upload(tenant, b"".join(orjson.dumps(line) + b"\n" for line in lines))
    created = await tenant.post(
        "/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/tasks",
            "completion_window": "24h",
            "invalid_lines": "error_file",
        },
    )
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]

    async def ended() -> bool:
        return (await tenant.get(f"/v1/batches/{batch_id}")).json()["status"] == "completed"

    await wait_for(ended, 120, "the job to complete", interval_s=0.25)
    job = (await tenant.get(f"/v1/batches/{batch_id}")).json()
    assert job["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    errors = (await tenant.get(f"/v1/files/{job['error_file_id']}/content")).content.splitlines()
    assert [orjson.loads(line)["custom_id"] for line in errors] == ["inward"]
    assert orjson.loads(errors[0])["error"]["code"] == "invalid_callback_url"


async def _upload(client: httpx.AsyncClient, content: bytes, name: str = "lines.jsonl") -> str:
    """An upload whose part names the file in raw UTF-8, control characters and all, as a
    hand-written client may (httpx would escape them)."""
    boundary = "hostile-boundary-7f3a"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    answer = await client.post(
        "/v1/files", content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])

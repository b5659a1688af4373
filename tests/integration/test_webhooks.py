"""Webhooks, received by a real HTTP server that checks every delivery with the
``standardwebhooks`` library, unmodified: task events from the batchers (done, failed,
expired, identical inputs, two models), batch events from the batch jobs' driver, retries
with backoff, dead deliveries that on-call lists and replays with the same id, and targets
inside the network refused. On the production-shape stack (auth on, two API workers)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web
from openai.types.webhooks import BatchCompletedWebhookEvent
from standardwebhooks import Webhook

from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.core.webhook_records import LOG_KEEP, TRIM_SLACK, WebhookRecords
from brimful.stack import EmbeddedStack, free_port
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for


@dataclass
class Receiver:
    """A webhook receiver on loopback: ``/ok`` answers 204, ``/flaky`` fails its first
    ``flaky_failures`` calls of each delivery, ``/down`` fails while ``down`` holds,
    ``/gone`` answers 410 while ``gone`` holds, ``/busy`` answers 429 with ``Retry-After:
    busy_for_s`` to the first call of each delivery."""

    url: str
    secrets: dict[str, str] = field(default_factory=dict)  # path -> the endpoint's secret
    received: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)  # verified
    bodies: dict[str, bytes] = field(default_factory=dict)  # webhook-id -> the body as it came
    calls: dict[str, int] = field(default_factory=dict)  # webhook-id -> calls
    flaky_failures: int = 2
    down: bool = True
    gone: bool = True
    busy_for_s: int = 2
    times: dict[str, list[float]] = field(default_factory=dict)  # webhook-id -> when each call came

    def events(self, path: str) -> list[dict[str, Any]]:
        return [event for where, _, event in self.received if where == path]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    got = Receiver(f"http://127.0.0.1:{port}")

    async def handle(request: web.Request) -> web.Response:
        path = request.path
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        event = Webhook(got.secrets[path]).verify(body, headers)  # raises on a bad signature
        message_id = headers["webhook-id"]
        got.calls[message_id] = got.calls.get(message_id, 0) + 1
        got.times.setdefault(message_id, []).append(time.monotonic())
        if path == "/flaky" and got.calls[message_id] <= got.flaky_failures:
            return web.Response(status=503)
        if path == "/down" and got.down:
            return web.Response(status=500)
        if path == "/gone" and got.gone:
            return web.Response(status=410)
        if path == "/busy" and got.calls[message_id] == 1:
            return web.Response(status=429, headers={"Retry-After": str(got.busy_for_s)})
        got.received.append((path, headers, event))
        got.bodies[message_id] = body
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/{path}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield got
    await runner.cleanup()


@pytest.fixture
async def api(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """The tenant's admin calls; every endpoint it made is removed afterwards."""
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['admin']}"}, timeout=30
    ) as client:
        yield client
        for endpoint in (await client.get("/v1/webhooks/endpoints")).json()["data"]:
            await client.delete(f"/v1/webhooks/endpoints/{endpoint['id']}")


async def register(api: httpx.AsyncClient, receiver: Receiver, path: str, events: list[str]) -> dict[str, Any]:
    answer = await api.post("/v1/webhooks/endpoints", json={"url": f"{receiver.url}{path}", "events": events})
    assert answer.status_code == 200, answer.text
    endpoint = answer.json()
    receiver.secrets[path] = endpoint["secret"]
    return endpoint


def until(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


async def submit(stack: EmbeddedStack, key: str, text: str, **fields: Any) -> str:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        answer = await http.post(
            "/v1/tasks", json={"inputs": {"TEXT": text}, **fields}, headers={"Authorization": f"Bearer {key}"}
        )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["task_id"])


async def test_finished_tasks_are_announced_signed_once_each(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await register(api, receiver, "/ok", ["task.completed", "task.failed", "task.expired"])
    text = f"announce me {uuid.uuid4().hex}"
    done = [await submit(openai_stack, openai_keys["submit"], text) for _ in range(3)]  # identical inputs
    small = await submit(openai_stack, openai_keys["submit"], text, model="brimful_reference_16")
    failed = await submit(openai_stack, openai_keys["submit"], f"!fail {uuid.uuid4().hex}")
    late = await submit(openai_stack, openai_keys["submit"], text, deadline_ms=1)
    foreign = await submit(openai_stack, openai_keys["other"], text)  # a tenant with no endpoint
    expected = {**dict.fromkeys([*done, small], "task.completed"), failed: "task.failed", late: "task.expired"}
    await wait_for(until(lambda: len(receiver.events("/ok")) >= len(expected)), 60, "every task's event")
    events = {event["data"]["task_id"]: event for event in receiver.events("/ok")}
    assert {task: event["type"] for task, event in events.items()} == expected
    assert foreign not in events
    for task in [*done, small]:
        assert events[task]["data"]["outputs"] == expected_outputs(text)
    assert events[failed]["data"]["error"]["message"] and events[late]["data"]["error"]["class"] == "expired"
    # The envelope OpenAI's events have beside Standard Webhooks' own: an id an event, its object, its time.
    assert all(event["object"] == "event" and isinstance(event["created_at"], int) for event in events.values())
    assert len({event["id"] for event in events.values()}) == len(events)
    assert all(event["id"].startswith("evt_") for event in events.values())
    # Each delivery came once, and says which; the log lists them delivered.
    assert all(calls == 1 for calls in receiver.calls.values())
    log = (await api.get("/v1/webhooks/deliveries")).json()["data"]
    ids = {headers["webhook-id"] for _, headers, _ in receiver.received}
    assert ids <= {entry["id"] for entry in log if entry["state"] == "delivered"}


async def test_a_thin_endpoint_is_told_which_task_finished_and_reads_the_rest_itself(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    answer = await api.post(
        "/v1/webhooks/endpoints",
        json={"url": f"{receiver.url}/thin", "events": ["task.completed", "task.failed"], "payload": "thin"},
    )
    assert answer.status_code == 200 and answer.json()["payload"] == "thin", answer.text
    receiver.secrets["/thin"] = answer.json()["secret"]
    await register(api, receiver, "/full", ["task.completed"])  # the same event, whole, to another endpoint
    text = f"thin {uuid.uuid4().hex}"
    done = await submit(openai_stack, openai_keys["submit"], text)
    failed = await submit(openai_stack, openai_keys["submit"], f"!fail {text}")
    await wait_for(until(lambda: len(receiver.events("/thin")) >= 2), 60, "both thin events")
    await wait_for(until(lambda: len(receiver.events("/full")) >= 1), 60, "the full event")
    thin = {event["data"]["task_id"]: event for event in receiver.events("/thin")}
    assert set(thin) == {done, failed}
    for task_id, status in ((done, "done"), (failed, "failed")):
        assert set(thin[task_id]["data"]) == {"task_id", "model", "status", "submitted_at_ms", "updated_at_ms"}
        assert thin[task_id]["data"]["status"] == status
    full = receiver.events("/full")[0]
    assert full["id"] == thin[done]["id"] and full["data"]["outputs"] == expected_outputs(text)  # one event
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['submit']}"}
    ) as http:  # what a thin receiver does next
        assert (await http.get(f"/v1/tasks/{done}")).json()["outputs"] == expected_outputs(text)
    listed = (await api.get("/v1/webhooks/endpoints")).json()["data"]
    assert {endpoint["url"].rsplit("/", 1)[1]: endpoint["payload"] for endpoint in listed} == {
        "thin": "thin",
        "full": "full",
    }


async def test_a_batch_job_announces_its_end(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await register(api, receiver, "/ok", ["batch.completed", "batch.cancelled"])
    headers = {"Authorization": f"Bearer {openai_keys['submit']}"}
    line = {"custom_id": "one", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": "batch event"}}}
    async with httpx.AsyncClient(base_url=openai_stack.api_url, headers=headers, timeout=30) as http:
        uploaded = await http.post(
            "/v1/files", files={"file": ("one.jsonl", orjson.dumps(line) + b"\n")}, data={"purpose": "batch"}
        )
        batch = await http.post(
            "/v1/batches",
            json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/tasks", "completion_window": "1h"},
        )
    batch_id = batch.json()["id"]
    await wait_for(until(lambda: bool(receiver.events("/ok"))), 60, "the batch's event")
    (event,) = receiver.events("/ok")
    assert event["type"] == "batch.completed" and event["data"]["id"] == batch_id
    assert event["data"]["status"] == "completed" and event["data"]["output_file_id"]
    assert event["data"]["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    # OpenAI's own client reads the same delivery as the event it would get from OpenAI.
    ((_, headers, _),) = receiver.received
    client = openai.OpenAI(api_key="unused", base_url=openai_stack.api_url + "/v1")
    unwrapped = client.webhooks.unwrap(receiver.bodies[headers["webhook-id"]], headers, secret=receiver.secrets["/ok"])
    assert isinstance(unwrapped, BatchCompletedWebhookEvent) and unwrapped.data.id == batch_id
    assert unwrapped.object == "event" and unwrapped.id.startswith("evt_") and unwrapped.id == event["id"]
    assert abs(unwrapped.created_at - time.time()) < 120


async def test_failed_attempts_are_retried_then_dead_and_on_call_replays_them(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await register(api, receiver, "/flaky", ["task.completed"])
    await register(api, receiver, "/down", ["task.completed"])
    task = await submit(openai_stack, openai_keys["submit"], f"retry me {uuid.uuid4().hex}")
    await wait_for(until(lambda: bool(receiver.events("/flaky"))), 60, "the flaky endpoint's delivery")
    # Three retries, then dead: the settings of the stack wait 0.3 s between attempts.
    dead = await wait_for_dead(api)
    assert dead["attempts"] == 4 and dead["last_status"] == 500 and dead["event_type"] == "task.completed"
    flaky_id = next(headers["webhook-id"] for path, headers, _ in receiver.received if path == "/flaky")
    assert receiver.calls[flaky_id] == receiver.flaky_failures + 1
    shown = (await api.get(f"/v1/webhooks/deliveries/{dead['id']}")).json()
    assert shown["payload"]["data"]["task_id"] == task
    receiver.down = False
    replayed = await api.post(f"/v1/webhooks/deliveries/{dead['id']}/replay")
    assert replayed.status_code == 200 and replayed.json()["state"] == "pending"
    await wait_for(until(lambda: bool(receiver.events("/down"))), 30, "the replayed delivery")
    (_, headers, event) = next(entry for entry in receiver.received if entry[0] == "/down")
    assert headers["webhook-id"] == dead["id"] and event["data"]["task_id"] == task
    assert (await api.get("/v1/webhooks/deliveries?state=dead")).json()["data"] == []
    # Another tenant's on-call sees none of it.
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['other-admin']}"}
    ) as other:
        assert (await other.get(f"/v1/webhooks/deliveries/{dead['id']}")).status_code == 404
        assert (await other.post(f"/v1/webhooks/deliveries/{dead['id']}/replay")).status_code == 404
        assert (await other.get("/v1/webhooks/endpoints")).json()["data"] == []


async def wait_for_dead(api: httpx.AsyncClient) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    async def listed() -> bool:
        found[:] = (await api.get("/v1/webhooks/deliveries?state=dead")).json()["data"]
        return bool(found)

    await wait_for(listed, 30, "a dead delivery")
    return found[0]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.2:9/hook",  # loopback, not the allowed 127.0.0.1
        "http://localhost:9/hook",  # a name that resolves to loopback
        "http://169.254.169.254/latest/meta-data",  # the cloud metadata address
        "http://10.1.2.3/hook",
        "http://[::1]:9/hook",
        "http://[::ffff:192.168.0.1]/hook",
        "ftp://example.com/hook",
        "http://user:pass@example.com/hook",
        "http:///no-host",
    ],
)
async def test_targets_inside_the_network_are_refused(api: httpx.AsyncClient, url: str) -> None:
    answer = await api.post("/v1/webhooks/endpoints", json={"url": url, "events": ["task.completed"]})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_url", answer.text


async def test_bad_endpoint_requests_get_a_clear_4xx(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient
) -> None:
    for body, says in [
        ({"url": "http://127.0.0.1:9/x", "events": ["task.started"]}, "events"),
        ({"url": "http://127.0.0.1:9/x", "events": []}, "events"),
        ({"events": ["task.completed"]}, "url"),
        ({"url": "http://127.0.0.1:9/x", "events": ["task.completed"], "secret": "mine"}, "secret"),
        ({"url": "http://127.0.0.1:9/x", "events": ["task.completed"], "payload": "slim"}, "payload"),
        ({"url": "http://127.0.0.1:9/x", "events": ["task.completed"], "payload": "thin²"}, "payload"),
        ({"url": "http://127.0.0.1:9/x", "events": ["task.completed"], "payload": ["thin"]}, "payload"),
    ]:
        answer = await api.post("/v1/webhooks/endpoints", json=body)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], answer.text
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['submit']}"}
    ) as not_admin:
        assert (await not_admin.get("/v1/webhooks/endpoints")).status_code == 403
    assert (await api.delete("/v1/webhooks/endpoints/we_000000000000000000000000")).status_code == 404
    made = [
        await api.post("/v1/webhooks/endpoints", json={"url": f"http://127.0.0.1:9/{n}", "events": ["task.failed"]})
        for n in range(17)
    ]
    assert [answer.status_code for answer in made].count(200) == 16 and made[-1].status_code == 400


async def test_a_task_with_a_callback_url_is_posted_its_result_signed_with_its_origins_own_secret(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    shown = (await api.get("/v1/webhooks/callback-secret", params={"url": f"{receiver.url}/cb"})).json()
    secret = shown["secret"]
    assert shown["origin"] == receiver.url and secret.startswith("whsec_")
    # One secret an origin: another path, or the same origin spelled otherwise, reads the same one.
    for same in (f"{receiver.url}/other?x=1", receiver.url.replace("http://", "HTTP://") + "/cb"):
        assert (await api.get("/v1/webhooks/callback-secret", params={"url": same})).json()["secret"] == secret
    port = int(receiver.url.rsplit(":", 1)[1])
    elsewhere = (
        await api.get("/v1/webhooks/callback-secret", params={"url": f"http://127.0.0.1:{port + 1}/cb"})
    ).json()
    assert elsewhere["secret"] != secret  # another receiver holds another secret
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['other-admin']}"}
    ) as other_tenant:
        theirs = await other_tenant.get("/v1/webhooks/callback-secret", params={"url": f"{receiver.url}/cb"})
        assert theirs.status_code == 200 and theirs.json()["secret"] != secret
    receiver.secrets["/cb"] = secret  # the receiver verifies with its own origin's secret only
    text = f"call me back {uuid.uuid4().hex}"
    task = await submit(openai_stack, openai_keys["submit"], text, callback_url=f"{receiver.url}/cb")
    failing = await submit(openai_stack, openai_keys["submit"], f"!fail {text}", callback_url=f"{receiver.url}/cb")
    await wait_for(until(lambda: len(receiver.events("/cb")) >= 2), 60, "both callbacks")
    events = {event["data"]["task_id"]: event for event in receiver.events("/cb")}
    assert events[task]["type"] == "task.completed" and events[task]["data"]["outputs"] == expected_outputs(text)
    assert events[failing]["type"] == "task.failed"
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['submit']}"}
    ) as http:
        for url in ("http://10.0.0.7/cb", "http://localhost:9/cb", "file:///etc/passwd"):
            answer = await http.post("/v1/tasks", json={"inputs": {"TEXT": "x"}, "callback_url": url})
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_callback_url", url
        bulk = await http.post(
            "/v1/tasks:batch",
            json={
                "tasks": [{"inputs": {"TEXT": "x"}, "callback_url": "http://10.0.0.7/cb"}, {"inputs": {"TEXT": "y"}}]
            },
        )
        results = bulk.json()["results"]
        assert results[0]["error"]["code"] == "invalid_callback_url" and "task_id" in results[1]


async def test_bad_callback_secret_urls_get_a_clear_4xx_naming_url(api: httpx.AsyncClient) -> None:
    missing = await api.get("/v1/webhooks/callback-secret")
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "url"
    for url in ("file:///etc/passwd", "https://a.example:²/cb", "https://a.example:８０/cb", "https://u:p@a.example/",
                "https:///nohost", "https://a.example/" + "x" * 5000, "ftp://a.example/"):  # fmt: skip
        answer = await api.get("/v1/webhooks/callback-secret", params={"url": url})
        assert answer.status_code == 400, (url, answer.text)
        assert answer.json()["error"]["code"] == "invalid_callback_url" and answer.json()["error"]["param"] == "url"
    unicode_host = await api.get("/v1/webhooks/callback-secret", params={"url": "https://ëxample.com/cb"})
    assert unicode_host.status_code == 200 and unicode_host.json()["origin"] == "https://ëxample.com:443"


async def test_a_tenants_silent_receivers_delay_no_other_tenants_delivery(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    """Another tenant's endpoint never answers and forty deliveries wait on it: this
    tenant's delivery to a receiver that answers at once still comes within seconds of its
    task's end (before, attempts went in groups that waited for their slowest)."""
    release = asyncio.Event()
    hanging = web.Application()

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.wait_for(release.wait(), 60)
        return web.Response(status=204)

    hanging.router.add_post("/hang", hang)
    runner = web.AppRunner(hanging)
    await runner.setup()
    hang_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", hang_port).start()
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['other-admin']}"}, timeout=30
    ) as other_admin:
        made = await other_admin.post(
            "/v1/webhooks/endpoints", json={"url": f"http://127.0.0.1:{hang_port}/hang", "events": ["task.completed"]}
        )
        assert made.status_code == 200, made.text
        try:
            tag = uuid.uuid4().hex
            async with httpx.AsyncClient(base_url=openai_stack.api_url, timeout=30) as http:
                bulk = await http.post(
                    "/v1/tasks:batch",
                    json={"tasks": [{"inputs": {"TEXT": f"silent {tag} {n}"}} for n in range(40)]},
                    headers={"Authorization": f"Bearer {openai_keys['other']}"},
                )
                assert bulk.json()["accepted"] == 40, bulk.text
                await register(api, receiver, "/ok", ["task.completed"])
                silent_ids = [result["task_id"] for result in bulk.json()["results"]]
                await wait_for(
                    lambda: _all_done(http, openai_keys["other"], silent_ids), 60, "the silent tenant's tasks"
                )
                mine = await submit(openai_stack, openai_keys["submit"], f"heard at once {tag}")
                await wait_for(lambda: _all_done(http, openai_keys["submit"], [mine]), 30, "this tenant's task")
                finished_at = time.monotonic()
                await wait_for(
                    until(lambda: any(e["data"]["task_id"] == mine for e in receiver.events("/ok"))),
                    30,
                    "this tenant's delivery",
                    interval_s=0.05,
                )
                assert time.monotonic() - finished_at < 5.0
        finally:
            await other_admin.delete(f"/v1/webhooks/endpoints/{made.json()['id']}")
            release.set()
            await runner.cleanup()


async def _all_done(http: httpx.AsyncClient, key: str, task_ids: list[str]) -> bool:
    for task_id in task_ids:
        answer = await http.get(f"/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {key}"})
        if answer.json().get("status") not in ("done", "failed"):
            return False
    return True


async def test_a_tenants_delivery_records_are_bounded(openai_stack: EmbeddedStack) -> None:
    """Past LOG_KEEP a tenant's oldest finished deliveries go, payloads and all; pending ones
    stay until they end. Under a key prefix of its own: no sender tries these."""
    redis = make_redis(openai_stack.settings)
    keys = RedisKeys(f"bounded-{uuid.uuid4().hex[:8]}")
    records = WebhookRecords(redis, keys)
    try:
        first = [
            (await records.emit("t", "task.completed", {"n": n}, f"e{n}", callback_url="http://127.0.0.1:9/"))[0]
            for n in range(LOG_KEEP)
        ]
        for delivery_id in first[10:]:  # all but the ten oldest delivered
            delivery = await records.delivery(delivery_id)
            assert delivery is not None
            delivery.state = "delivered"
            await records.record_attempt(delivery)
        for n in range(LOG_KEEP, LOG_KEEP + TRIM_SLACK + 1):
            await records.emit("t", "task.completed", {"n": n}, f"e{n}", callback_url="http://127.0.0.1:9/")
        assert await redis.zcard(keys.webhook_log("t")) == LOG_KEEP
        gone = [await records.delivery(delivery_id) is None for delivery_id in first[10 : TRIM_SLACK + 1]]
        assert all(gone)  # the oldest delivered ones: records removed
        still = [await records.delivery(delivery_id) for delivery_id in first[:10]]  # out of the log, still pending
        assert all(d is not None and d.state == "pending" for d in still)
    finally:
        await redis.aclose()


def announced(receiver: Receiver, path: str, task_id: str) -> bool:
    return any(event["data"].get("task_id") == task_id for event in receiver.events(path))


async def test_a_rotated_secret_signs_beside_the_old_one_for_either_receiver(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    endpoint = await register(api, receiver, "/ok", ["task.completed"])
    old = endpoint["secret"]
    answer = await api.post(f"/v1/webhooks/endpoints/{endpoint['id']}/rotate-secret")
    assert answer.status_code == 200, answer.text
    new = answer.json()["secret"]
    assert new != old and new.startswith("whsec_") and answer.json()["previous_secret_valid_until"] > time.time()
    for held in (old, new):  # a receiver that holds only the old secret, then only the new one
        receiver.secrets["/ok"] = held
        task_id = await submit(openai_stack, openai_keys["submit"], f"rotation {uuid.uuid4().hex}")
        await wait_for(until(partial(announced, receiver, "/ok", task_id)), 60, "the event")
    assert all(len(headers["webhook-signature"].split(" ")) == 2 for _, headers, _ in receiver.received)
    listed = (await api.get("/v1/webhooks/endpoints")).json()["data"]
    assert "secret" not in listed[0] and listed[0]["previous_secret_valid_until"]
    # Another tenant's admin, and ids that are not ids, find no endpoint to rotate.
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['other-admin']}"}, timeout=30
    ) as other:
        assert (await other.post(f"/v1/webhooks/endpoints/{endpoint['id']}/rotate-secret")).status_code == 404
    for wrong in ("we_0", "%C2%B2", "x" * 5000):
        assert (await api.post(f"/v1/webhooks/endpoints/{wrong}/rotate-secret")).status_code == 404, wrong


async def test_a_receiver_answering_410_disables_its_endpoint_and_the_tenant_is_told(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await register(api, receiver, "/ok", ["webhook_endpoint.disabled", "task.completed"])
    gone = await register(api, receiver, "/gone", ["task.completed"])
    first = await submit(openai_stack, openai_keys["submit"], f"to a gone receiver {uuid.uuid4().hex}")

    def told() -> list[dict[str, Any]]:
        return [event for event in receiver.events("/ok") if event["type"] == "webhook_endpoint.disabled"]

    await wait_for(until(lambda: bool(told())), 60, "the endpoint's disabling to be told")
    (event,) = told()
    assert event["data"]["id"] == gone["id"] and "410" in event["data"]["disabled_reason"]
    (shown,) = [e for e in (await api.get("/v1/webhooks/endpoints")).json()["data"] if e["id"] == gone["id"]]
    assert shown["disabled"] and "410" in shown["disabled_reason"]
    dead = (await api.get("/v1/webhooks/deliveries", params={"state": "dead"})).json()["data"]
    assert [d["last_status"] for d in dead if d["endpoint_id"] == gone["id"]] == [410]
    # While disabled it is sent nothing: the other endpoint hears of the task, it does not.
    calls = sum(receiver.calls.values())
    quiet = await submit(openai_stack, openai_keys["submit"], f"while disabled {uuid.uuid4().hex}")
    await wait_for(until(partial(announced, receiver, "/ok", quiet)), 60, "the task's event at the other endpoint")
    assert sum(receiver.calls.values()) == calls + 1 and not announced(receiver, "/gone", quiet)
    recover = f"/v1/webhooks/endpoints/{gone['id']}/recover"
    assert (await api.post(recover, json={"since": 0})).status_code == 409  # disabled: enable it first
    receiver.gone = False
    enabled = await api.post(f"/v1/webhooks/endpoints/{gone['id']}/enable")
    assert enabled.status_code == 200 and not enabled.json()["disabled"]
    task_id = await submit(openai_stack, openai_keys["submit"], f"once enabled {uuid.uuid4().hex}")
    await wait_for(until(partial(announced, receiver, "/gone", task_id)), 60, "the event once enabled")
    # What it lost while gone, recovered in one call: the dead delivery since then, sent again.
    for body, param in (({"since": "yesterday"}, "since"), ({}, "since"), ({"since": -1}, "since"), ([], None)):
        refused = await api.post(recover, json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert (await api.post(recover, json={"since": int(time.time()) + 3600})).json()["data"] == []
    recovered = (await api.post(recover, json={"since": int(time.time()) - 600})).json()["data"]
    assert [d["endpoint_id"] for d in recovered] == [gone["id"]]
    await wait_for(until(partial(announced, receiver, "/gone", first)), 60, "the recovered delivery")


async def test_a_receivers_retry_after_is_honoured(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    await register(api, receiver, "/busy", ["task.completed"])
    task_ids = [await submit(openai_stack, openai_keys["submit"], f"busy {uuid.uuid4().hex}") for _ in range(2)]
    await wait_for(until(lambda: len(receiver.events("/busy")) == 2), 60, "both events, after the 429s")
    assert {e["data"]["task_id"] for e in receiver.events("/busy")} == set(task_ids)
    for message_id, times in receiver.times.items():
        assert len(times) == 2 and times[1] - times[0] >= receiver.busy_for_s - 0.05, (message_id, times)


async def test_another_tenants_endpoint_and_hostile_bodies_are_refused_on_the_new_routes(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], api: httpx.AsyncClient, receiver: Receiver
) -> None:
    endpoint = await register(api, receiver, "/ok", ["task.completed"])
    recover = f"/v1/webhooks/endpoints/{endpoint['id']}/recover"
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['other-admin']}"}, timeout=30
    ) as other:
        for path in ("enable", "recover", "rotate-secret"):
            answer = await other.post(f"/v1/webhooks/endpoints/{endpoint['id']}/{path}", json={"since": 0})
            assert answer.status_code == 404, (path, answer.text)
    for body, status in (
        (b'{"since": ' + b"9" * 400 + b"}", 400),  # a number Brimful will not read
        (b'{"since": 1e999}', 400),  # not finite
        (b'{"since": NaN}', 400),
        (b'{"since": 1.5}', 400),
        (b'{"since": "\\u0661\\u0662"}', 400),  # Arabic-Indic digits
        (b'{"since": 0, "pad": "' + b"x" * 20_000 + b'"}', 413),  # past the body's bound
    ):
        answer = await api.post(recover, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == status, (body[:40], answer.text)
        assert answer.json()["error"]["message"], body[:40]
    assert (await api.get("/v1/webhooks/endpoints")).json()["data"][0]["id"] == endpoint["id"]  # unharmed

"""Keys, tenants and scopes on a stack with auth on (as docker-compose runs)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from redis import Redis

from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack, settings_env
from tests.helpers.metrics import metric_values
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack

RATE, BURST = 5.0, 10
READ_RATE, READ_BURST, LONG_POLLS = 20.0, 40, 3


@pytest.fixture(scope="module")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    settings = stack_settings(
        auth_enabled=True,
        rate_limit_per_s=RATE,
        rate_limit_burst=BURST,
        read_rate_limit_per_s=READ_RATE,
        read_rate_limit_burst=READ_BURST,
        tenant_max_long_polls=LONG_POLLS,
    )
    running = start_stack(tmp_path_factory.mktemp("auth-stack"), settings)
    yield running
    running.stop()


def keys_cli(stack: EmbeddedStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brimful.cli", "keys", *args],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def create_key(stack: EmbeddedStack, tenant: str, scopes: str) -> tuple[str, str]:
    """(key, key id) from `brimful keys create`: the key on stdout, its id on stderr."""
    made = keys_cli(stack, "create", "--tenant", tenant, "--scopes", scopes, "--name", f"test {tenant}")
    assert made.returncode == 0, made.stderr
    return made.stdout.strip(), made.stderr.split()[1]


def new_key(stack: EmbeddedStack, tenant: str, scopes: str) -> str:
    return create_key(stack, tenant, scopes)[0]


async def call(
    stack: EmbeddedStack, method: str, path: str, key: str | None = None, **kwargs: object
) -> tuple[int, dict]:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{stack.api_url}{path}", headers=headers, **kwargs) as response:  # type: ignore[arg-type]
            body = await response.json(content_type=None)
            if response.status == 401:
                assert response.headers.get("WWW-Authenticate") == "Bearer"
            return response.status, body


async def test_no_key_or_a_wrong_key_is_401(auth_stack: EmbeddedStack) -> None:
    for key in (None, "bf_not-a-real-key"):
        status, body = await call(auth_stack, "POST", "/v1/tasks", key, json={"inputs": {"TEXT": "x"}})
        assert status == 401 and body["error"]["code"] == "unauthenticated"
        status, _ = await call(auth_stack, "GET", f"/v1/tasks/{'0' * 32}", key)
        assert status == 401
    status, _ = await call(auth_stack, "GET", "/readyz")
    assert status == 200  # probes stay open


async def test_a_task_is_visible_only_to_its_own_tenant(auth_stack: EmbeddedStack) -> None:
    acme, globex = new_key(auth_stack, "acme", "submit,read"), new_key(auth_stack, "globex", "submit,read")
    status, body = await call(
        auth_stack, "POST", "/v1/tasks", acme, params={"wait": "10"}, json={"inputs": {"TEXT": "mine"}}
    )
    assert status == 200 and body["status"] == "done"
    task_id = body["task_id"]
    assert (await call(auth_stack, "GET", f"/v1/tasks/{task_id}", acme))[0] == 200
    for method, params in (("GET", {}), ("GET", {"wait": "1"}), ("DELETE", {})):
        status, body = await call(auth_stack, method, f"/v1/tasks/{task_id}", globex, params=params)
        assert status == 404 and body["error"]["code"] == "task_not_found"


async def test_scopes_are_enforced(auth_stack: EmbeddedStack) -> None:
    reader = new_key(auth_stack, "acme", "read")
    submitter = new_key(auth_stack, "acme", "submit")
    admin = new_key(auth_stack, "ops", "admin")
    status, body = await call(auth_stack, "POST", "/v1/tasks", reader, json={"inputs": {"TEXT": "x"}})
    assert status == 403 and "submit" in body["error"]["message"]
    for path in ("/v1/admin/policy", "/v1/admin/dlq"):
        for key in (reader, submitter):
            status, body = await call(auth_stack, "GET", path, key)
            assert status == 403 and body["error"]["code"] == "forbidden"
        assert (await call(auth_stack, "GET", path, admin))[0] == 200
    status, _ = await call(auth_stack, "PATCH", "/v1/admin/policy", submitter, json={"max_wait_ms": 100})
    assert status == 403


async def test_only_an_operator_changes_the_policy_every_tenant_shares(auth_stack: EmbeddedStack) -> None:
    tenant_admin, operator = new_key(auth_stack, "acme", "admin"), new_key(auth_stack, "ops", "admin,operator")
    before = (await call(auth_stack, "GET", "/v1/admin/policy", tenant_admin))[1]["params"]
    status, body = await call(auth_stack, "PATCH", "/v1/admin/policy", tenant_admin, json={"max_wait_ms": 10})
    assert status == 403 and "operator" in body["error"]["message"], body
    assert (await call(auth_stack, "GET", "/v1/admin/policy", operator))[1]["params"] == before
    status, body = await call(
        auth_stack, "PATCH", "/v1/admin/policy", operator, json={"max_wait_ms": before["max_wait_ms"]}
    )
    assert status == 200, body


async def test_a_revoked_key_is_refused_within_a_second(auth_stack: EmbeddedStack) -> None:
    key, key_id = create_key(auth_stack, "acme", "submit,read")
    assert (await call(auth_stack, "POST", "/v1/tasks", key, json={"inputs": {"TEXT": "before"}}))[0] == 202
    revoked = keys_cli(auth_stack, "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    revoked_at = time.monotonic()
    status, _ = await call(auth_stack, "POST", "/v1/tasks", key, json={"inputs": {"TEXT": "after"}})
    assert status == 401
    assert time.monotonic() - revoked_at < 1.0
    assert any(key_id in line and "revoked" in line for line in keys_cli(auth_stack, "list").stdout.splitlines())


def test_keys_are_never_stored_or_logged_in_clear(auth_stack: EmbeddedStack) -> None:
    key = new_key(auth_stack, "acme", "submit,read")
    request = urllib.request.Request(  # use it, so it would be logged if anything logged keys
        f"{auth_stack.api_url}/v1/tasks/{'0' * 32}", headers={"Authorization": f"Bearer {key}"}
    )
    with pytest.raises(urllib.error.HTTPError):  # 404: no such task
        urllib.request.urlopen(request, timeout=10)
    redis = Redis.from_url(auth_stack.settings.redis_url)
    try:
        for name in redis.scan_iter(count=1000):
            assert key.encode() not in name
            kind = redis.type(name)
            if kind == b"hash":
                assert all(key.encode() not in k + v for k, v in redis.hgetall(name).items())
            elif kind == b"string":
                assert key.encode() not in (redis.get(name) or b"")
    finally:
        redis.close()
    for log in Path(auth_stack.workdir, "logs").glob("*.log"):
        assert key not in log.read_text(errors="replace"), f"{log.name} holds a key in clear"
    listing = keys_cli(auth_stack, "list").stdout
    assert key not in listing and "acme" in listing


async def test_rate_limit_answers_429_with_retry_after_and_never_over_admits(auth_stack: EmbeddedStack) -> None:
    key = new_key(auth_stack, "limited", "submit,read")
    headers = {"Authorization": f"Bearer {key}"}
    answers: list[tuple[int, str | None]] = []

    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            async with session.post(
                f"{auth_stack.api_url}/v1/tasks", headers=headers, json={"inputs": {"TEXT": "r"}}
            ) as r:
                answers.append((r.status, r.headers.get("Retry-After")))

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(40)))
        elapsed = time.monotonic() - started
        accepted = sum(1 for status, _ in answers if status == 202)
        limited = [retry for status, retry in answers if status == 429]
        assert BURST <= accepted <= BURST + RATE * elapsed + 1, (accepted, elapsed)
        assert accepted + len(limited) == 40
        assert limited and all(retry is not None and 1 <= int(retry) <= 2 for retry in limited)
        await asyncio.sleep(int(limited[0]))  # the bucket refills meanwhile: that is the behaviour under test
        await one()
        assert answers[-1][0] == 202


def tenants_cli(stack: EmbeddedStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brimful.cli", "tenants", *args],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_a_tenant_payload_limit_refuses_larger_tasks_with_413(auth_stack: EmbeddedStack) -> None:
    made = tenants_cli(auth_stack, "set", "small", "--max-payload-bytes", "64")
    assert made.returncode == 0, made.stderr
    small, other = new_key(auth_stack, "small", "submit,read"), new_key(auth_stack, "roomy", "submit,read")

    status, body = await call(auth_stack, "POST", "/v1/tasks", small, json={"inputs": {"TEXT": "x" * 200}})
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert "64 bytes" in body["error"]["message"]
    status, body = await call(
        auth_stack, "POST", "/v1/tasks", small, params={"wait": "10"}, json={"inputs": {"TEXT": "tiny"}}
    )
    assert status == 200 and body["status"] == "done"
    status, body = await call(
        auth_stack,
        "POST",
        "/v1/tasks:batch",
        small,
        json={"tasks": [{"inputs": {"TEXT": "ok"}}, {"inputs": {"TEXT": "y" * 200}}]},
    )
    assert status == 200 and body["accepted"] == 1
    assert "task_id" in body["results"][0] and body["results"][1]["error"]["code"] == "payload_too_large"
    # The limit is the tenant's own: the default admits the same task for another tenant.
    assert (await call(auth_stack, "POST", "/v1/tasks", other, json={"inputs": {"TEXT": "x" * 200}}))[0] == 202
    listing = tenants_cli(auth_stack, "list").stdout
    assert any(line.split()[:2] == ["small", "64"] for line in listing.splitlines()), listing


async def test_a_tenant_in_flight_limit_admits_exactly_that_many_and_frees_slots_as_tasks_finish(
    auth_stack: EmbeddedStack,
) -> None:
    assert tenants_cli(auth_stack, "set", "busy", "--max-in-flight", "5").returncode == 0
    busy, admin = new_key(auth_stack, "busy", "submit,read"), new_key(auth_stack, "ops", "admin,operator,read")
    redis = Redis.from_url(auth_stack.settings.redis_url)
    in_flight_key = RedisKeys(auth_stack.settings.key_prefix).in_flight("busy")
    # Batches of a few rows wait 4 s: the accepted tasks stay in flight while the test looks.
    await set_policy(auth_stack, admin, max_wait_ms=4000, min_wait_ms=4000)
    try:
        answers = await asyncio.gather(
            *(call(auth_stack, "POST", "/v1/tasks", busy, json={"inputs": {"TEXT": f"f{i}"}}) for i in range(8))
        )
        accepted = [body["task_id"] for status, body in answers if status == 202]
        refused = [body for status, body in answers if status == 429]
        assert len(accepted) == 5 and len(refused) == 3, answers
        assert all(body["error"]["code"] == "too_many_in_flight" for body in refused)
        assert redis.zcard(in_flight_key) == 5
        payload_limit = str(auth_stack.settings.tenant_max_payload_bytes)
        listing = tenants_cli(auth_stack, "list").stdout.splitlines()
        assert any(line.split()[:4] == ["busy", payload_limit, "5", "5"] for line in listing), listing

        # A cancel frees its slot at once.
        assert (await call(auth_stack, "DELETE", f"/v1/tasks/{accepted[0]}", busy))[0] == 200
        status, body = await call(auth_stack, "POST", "/v1/tasks", busy, json={"inputs": {"TEXT": "after cancel"}})
        assert status == 202, body
        accepted = [*accepted[1:], body["task_id"]]
        assert (await call(auth_stack, "POST", "/v1/tasks", busy, json={"inputs": {"TEXT": "one too many"}}))[0] == 429
    finally:
        await set_policy(
            auth_stack, admin, max_wait_ms=auth_stack.settings.max_wait_ms, min_wait_ms=auth_stack.settings.min_wait_ms
        )

    for task_id in accepted:
        status, body = await call(auth_stack, "GET", f"/v1/tasks/{task_id}", busy, params={"wait": "10"})
        assert status == 200 and body["status"] == "done", body
    assert redis.zcard(in_flight_key) == 0  # finished tasks no longer count
    redis.close()
    status, body = await call(
        auth_stack, "POST", "/v1/tasks", busy, params={"wait": "10"}, json={"inputs": {"TEXT": "again"}}
    )
    assert status == 200 and body["status"] == "done"


async def set_policy(stack: EmbeddedStack, admin_key: str, **changes: float) -> None:
    """Tune the live policy with an admin key and wait until every batcher applies it."""
    status, body = await call(stack, "PATCH", "/v1/admin/policy", admin_key, json=changes)
    assert status == 200, body

    async def applied() -> bool:
        _, stats = await call(stack, "GET", "/v1/stats", admin_key)
        batchers = stats["batchers"]  # empty while a batcher's status is late: not yet known to apply it
        return bool(batchers) and all(b["params"]["max_wait"] == changes["max_wait_ms"] / 1000 for b in batchers)

    await wait_for(applied, 5, "the batchers to apply the policy", interval_s=0.05)


async def test_revoke_takes_the_whole_key_id_never_a_prefix(auth_stack: EmbeddedStack) -> None:
    key, key_id = create_key(auth_stack, "acme-prefix", "read")
    refused = keys_cli(auth_stack, "revoke", key_id[:8])  # a prefix could name another key than meant
    assert refused.returncode == 1 and "12-character" in refused.stderr
    status, _ = await call(auth_stack, "GET", "/v1/stats", key)
    assert status == 200  # still active
    assert keys_cli(auth_stack, "revoke", key_id).returncode == 0
    status, _ = await call(auth_stack, "GET", "/v1/stats", key)
    assert status == 401


async def test_invalid_items_of_a_bulk_call_take_tokens_too(auth_stack: EmbeddedStack) -> None:
    key = new_key(auth_stack, "bulk-metered", "submit,read")
    invalid = {"tasks": [{"inputs": {}} for _ in range(BURST)]}
    status, body = await call(auth_stack, "POST", "/v1/tasks:batch", key, json=invalid)
    assert status == 200 and body["accepted"] == 0 and len(body["results"]) == BURST
    status, body = await call(auth_stack, "POST", "/v1/tasks:batch", key, json=invalid)
    assert status == 429 and body["error"]["code"] == "rate_limited"  # the first call used up the burst


async def test_dead_letters_are_scoped_by_tenant_and_the_audit_names_the_key(auth_stack: EmbeddedStack) -> None:
    acme = new_key(auth_stack, "dlq-acme", "submit,read,admin")
    globex = new_key(auth_stack, "dlq-globex", "admin")
    on_call, on_call_id = create_key(auth_stack, "ops", "admin,operator")
    status, body = await call(
        auth_stack, "POST", "/v1/tasks", acme, params={"wait": "20"}, json={"inputs": {"TEXT": "!fail in acme"}}
    )
    assert status == 200 and body["status"] == "failed", body
    task_id = body["task_id"]

    def listed(answer: dict) -> set[str]:
        return {entry["task_id"] for entry in answer["entries"]}

    assert task_id in listed((await call(auth_stack, "GET", "/v1/admin/dlq", acme))[1])
    assert task_id not in listed((await call(auth_stack, "GET", "/v1/admin/dlq", globex))[1])
    assert (await call(auth_stack, "GET", f"/v1/admin/dlq/{task_id}", globex))[0] == 404
    status, body = await call(
        auth_stack,
        "POST",
        "/v1/admin/dlq/purge",
        globex,
        json={"ids": [task_id]},
        headers={"X-Brimful-Actor": "mallory"},
    )
    assert status == 200 and body["purged"] == 0  # another tenant's entry: untouched
    assert task_id in listed((await call(auth_stack, "GET", "/v1/admin/dlq", on_call))[1])
    status, body = await call(
        auth_stack,
        "POST",
        "/v1/admin/dlq/purge",
        on_call,
        json={"ids": [task_id]},
        headers={"X-Brimful-Actor": "mallory"},
    )
    assert status == 200 and body["purged"] == 1
    status, entry = await call(auth_stack, "GET", f"/v1/admin/dlq/{task_id}", acme)
    assert status == 200 and entry["resolution"]["actor"] == f"key {on_call_id} (mallory)"


async def test_reads_are_rate_limited_per_tenant(auth_stack: EmbeddedStack) -> None:
    reader, other = new_key(auth_stack, "reader", "submit,read"), new_key(auth_stack, "other-reader", "submit,read")
    status, body = await call(
        auth_stack, "POST", "/v1/tasks", reader, params={"wait": "10"}, json={"inputs": {"TEXT": "r"}}
    )
    assert status == 200, body
    path = f"/v1/tasks/{body['task_id']}"
    started = time.monotonic()
    answers = await asyncio.gather(*(call(auth_stack, "GET", path, reader) for _ in range(2 * READ_BURST)))
    elapsed = time.monotonic() - started
    admitted = sum(1 for status, _ in answers if status == 200)
    limited = [body for status, body in answers if status == 429]
    assert READ_BURST - 1 <= admitted <= READ_BURST + READ_RATE * elapsed + 1, (admitted, elapsed)
    assert admitted + len(limited) == 2 * READ_BURST
    assert all(b["error"]["code"] == "rate_limited" and "reads/s" in b["error"]["message"] for b in limited)
    # Another tenant's reads come from its own bucket.
    assert (await call(auth_stack, "GET", f"/v1/tasks/{'0' * 32}", other))[0] == 404


async def test_past_its_long_poll_limit_a_tenants_submissions_answer_at_once_and_its_follow_ups_wait(
    auth_stack: EmbeddedStack,
) -> None:
    waiter, admin = (
        new_key(auth_stack, "waiter", "submit,read"),
        new_key(auth_stack, "ops-waiter", "admin,operator,read"),
    )
    status, finished = await call(
        auth_stack, "POST", "/v1/tasks", waiter, params={"wait": "20"}, json={"inputs": {"TEXT": "quick"}}
    )
    assert status == 200 and finished["status"] == "done", finished
    # A lone row waits 20 s for company: long-polls on it stay held while the test looks.
    await set_policy(auth_stack, admin, max_wait_ms=20_000, min_wait_ms=20_000)
    try:
        status, body = await call(auth_stack, "POST", "/v1/tasks", waiter, json={"inputs": {"TEXT": "slow"}})
        assert status == 202, body
        path = f"/v1/tasks/{body['task_id']}"
        held = [
            asyncio.create_task(call(auth_stack, "GET", path, waiter, params={"wait": "30"})) for _ in range(LONG_POLLS)
        ]
        # Until the three are held: probing earlier could take a place one of them needs.
        deadline = time.monotonic() + 15
        while (await metric_values(f"{auth_stack.api_url}/metrics")).get("brimful_long_polls_waiting", 0) < LONG_POLLS:
            answered = [task.result() for task in held if task.done()]
            assert not answered, f"a long-poll was answered before the limit was reached: {answered}"
            assert time.monotonic() < deadline, "the long-polls were never held"
            await asyncio.sleep(0.05)

        async def long_poll(target: str) -> tuple[int, dict]:
            while True:  # an answer that meets the read limit only means "not yet"
                status, body = await call(auth_stack, "GET", target, waiter, params={"wait": "2"})
                if not (status == 429 and body["error"]["code"] == "rate_limited"):
                    return status, body
                assert time.monotonic() < deadline, body
                await asyncio.sleep(2 / READ_RATE)

        # Another long-poll on the pending task, past the limit, is held all the same: a
        # follow-up of the tenant's own task is never refused (refused, its client would come
        # back a second later); it is answered queued when its wait of 2 s ends.
        asked = time.monotonic()
        status, still = await long_poll(path)
        assert status == 200 and still["status"] == "queued", (status, still)
        assert time.monotonic() - asked >= 1.9, "the follow-up past the limit was not held"
        # A finished task, or an unknown one, is answered at once.
        status, body = await long_poll(f"/v1/tasks/{finished['task_id']}")
        assert status == 200 and body["status"] == "done" and body["outputs"] == finished["outputs"], body
        assert (await long_poll(f"/v1/tasks/{'0' * 32}"))[0] == 404
        assert not any(task.done() for task in held)
        # A POST with ?wait is still accepted, answered at once instead of held, and counted.
        declined = (await metric_values(f"{auth_stack.api_url}/metrics")).get("brimful_long_polls_declined_total", 0)
        status, body = await call(
            auth_stack, "POST", "/v1/tasks", waiter, params={"wait": "20"}, json={"inputs": {"TEXT": "x"}}
        )
        assert status == 202 and body["status"] == "queued"
        after = (await metric_values(f"{auth_stack.api_url}/metrics")).get("brimful_long_polls_declined_total", 0)
        assert after == declined + 1, (declined, after)
        # A plain GET is never refused for the waiters.
        assert (await call(auth_stack, "GET", path, waiter))[0] == 200
    finally:
        await set_policy(
            auth_stack, admin, max_wait_ms=auth_stack.settings.max_wait_ms, min_wait_ms=auth_stack.settings.min_wait_ms
        )
    for status, body in await asyncio.gather(*held):
        assert status == 200 and body["status"] == "done", body


async def test_a_cached_result_never_crosses_tenants(auth_stack: EmbeddedStack) -> None:
    acme, globex = new_key(auth_stack, "acme", "submit,read"), new_key(auth_stack, "globex", "submit,read")
    text = {"inputs": {"TEXT": f"same question {uuid.uuid4().hex}"}}
    answers = []
    for key in (acme, acme, globex, globex):
        status, body = await call(auth_stack, "POST", "/v1/tasks", key, params={"wait": "10"}, json=text)
        assert status == 200 and body["status"] == "done", body
        answers.append(body)
    # Each tenant's first asking is computed; its second is its own earlier result.
    assert [body["cached"] for body in answers] == [False, True, False, True]
    assert all(body["outputs"] == answers[0]["outputs"] for body in answers)


async def test_dlq_calls_are_rate_limited_per_tenant_and_never_a_5xx(auth_stack: EmbeddedStack) -> None:
    greedy, other = new_key(auth_stack, "dlq-greedy", "admin"), new_key(auth_stack, "dlq-other", "admin")
    burst = auth_stack.settings.dlq_rate_limit_burst
    answers = await asyncio.gather(*(call(auth_stack, "GET", "/v1/admin/dlq", greedy) for _ in range(burst + 20)))
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= 10, statuses
    refused = [body for status, body in answers if status == 429]
    assert {body["error"]["code"] for body in refused} <= {"rate_limited", "dlq_busy"}
    assert any(body["error"]["code"] == "rate_limited" for body in refused)
    assert (await call(auth_stack, "GET", "/v1/admin/dlq", other))[0] == 200  # a bucket of its own

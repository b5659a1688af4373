"""The models a Brimful serves: ``GET /v1/models``, a task's ``model`` field, the model
named in every answer about a task, and two fixed-batch models served at once, each with
its own row count, batcher, counters and policy. The shared stack serves what ``make up``
serves: the reference model at 64 rows (the default), the same function at 16, and the
small embedding model."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import tritonclient.grpc.aio as triton_aio
from redis.asyncio import Redis

from brimful.core.redis_keys import RedisKeys
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING
from brimful.stack import EmbeddedStack, sample_sums
from tests.helpers.metrics import batcher_metrics_url, metrics_page, model_stats, triton_counts
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.stacks import SMALL, rows_seen_by_model
from tests.helpers.task_client import TaskClient


async def triton_metadata(stack: EmbeddedStack, name: str) -> dict[str, Any]:
    """The model's metadata as its Triton server reports it, read past Brimful."""
    triton = triton_aio.InferenceServerClient(stack.settings.triton_endpoints[0])
    try:
        return dict(await triton.get_model_metadata(name, as_json=True))
    finally:
        await triton.close()


async def test_the_models_list_shows_the_served_model_as_its_triton_server_describes_it(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    status, body = await client.request("GET", "/v1/models")
    assert status == 200, body
    served = [stack.settings.model_name, SMALL, EMBEDDING]
    assert [m["name"] for m in body["models"]] == stack.settings.served_models == served
    assert [m["default"] for m in body["models"]] == [True, False, False]
    assert [m["kind"] for m in body["models"]] == ["tensor", "tensor", "embedding"]
    # The same list in OpenAI's shape, for its client.
    assert body["object"] == "list" and [(m["id"], m["object"]) for m in body["data"]] == [(n, "model") for n in served]
    for model in body["models"]:
        metadata = await triton_metadata(stack, model["name"])
        assert model["name"] == metadata["name"]
        assert model["version"] == metadata["versions"][-1]
        for side in ("inputs", "outputs"):
            assert model[side] == [
                {"name": t["name"], "datatype": t["datatype"], "shape": [int(d) for d in t["shape"][1:]]}
                for t in metadata[side]
            ]
            # Served with a fixed first dimension: the rows of every call, read from the model.
            assert {int(t["shape"][0]) for t in metadata[side]} == {model["batch_size"]}
    assert [m["batch_size"] for m in body["models"]] == [64, 16, 64]


async def test_a_task_that_names_the_model_runs_on_it_and_every_answer_names_it(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    name = stack.settings.model_name
    status, accepted = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "named"}, "model": name})
    assert status == 202 and accepted["model"] == name, accepted
    finished = await client.wait_final(accepted["task_id"])
    assert finished["status"] == "done" and finished["model"] == name
    assert finished["outputs"] == expected_outputs("named")
    # Answered by the long-poll, from the published record.
    status, inline = await client.request(
        "POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": "inline"}, "model": name}
    )
    assert status == 200 and inline["status"] == "done" and inline["model"] == name, inline


async def test_a_task_that_names_no_model_goes_to_the_default_and_says_so(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    status, accepted = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "unnamed"}})
    assert status == 202 and accepted["model"] == stack.settings.model_name, accepted
    assert (await client.wait_final(accepted["task_id"]))["model"] == stack.settings.model_name


async def test_an_unknown_model_is_422_naming_the_models_served(stack: EmbeddedStack, client: TaskClient) -> None:
    status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "x"}, "model": "no_such_model"})
    assert status == 422 and body["error"]["code"] == "unknown_model", body
    assert "no_such_model" in body["error"]["message"] and stack.settings.model_name in body["error"]["message"]
    status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "x"}, "model": 16})
    assert status == 422 and body["error"]["code"] == "invalid_request" and "model" in body["error"]["message"], body


async def test_a_bulk_item_naming_an_unknown_model_fails_alone(stack: EmbeddedStack, client: TaskClient) -> None:
    items = [
        {"inputs": {"TEXT": "bulk-default"}},
        {"inputs": {"TEXT": "bulk-unknown"}, "model": "no_such_model"},
        {"inputs": {"TEXT": "bulk-named"}, "model": stack.settings.model_name},
    ]
    status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": items})
    assert status == 200 and body["accepted"] == 2, body
    first, unknown, named = body["results"]
    assert unknown["error"]["code"] == "unknown_model"
    for answer in (first, named):
        assert answer["model"] == stack.settings.model_name
        assert (await client.wait_final(answer["task_id"]))["status"] == "done"


async def test_two_models_at_once_each_call_has_exactly_its_models_rows(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    default = stack.settings.model_name
    before = {name: await model_stats(client, name) for name in (default, SMALL)}
    triton_before = {name: await triton_counts(stack, name) for name in (default, SMALL)}
    pages_before = {name: await metrics_page(batcher_metrics_url(stack, name)) for name in (default, SMALL)}
    api_before = await metrics_page(stack.api_url)
    # Submitted together, interleaved: 40 rows cannot fit one call of the 16-row model.
    texts = {name: [f"{name} row {i}" for i in range(40)] for name in (default, SMALL)}
    answers = await asyncio.gather(
        *(
            client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}, "model": name})
            for i in range(40)
            for name, text in ((default, texts[default][i]), (SMALL, texts[SMALL][i]))
        )
    )
    assert all(status == 202 for status, _ in answers), answers
    results = await asyncio.gather(*(client.wait_final(body["task_id"], timeout_s=60) for _, body in answers))
    for (_, accepted), result in zip(answers, results):
        assert result["status"] == "done" and result["model"] == accepted["model"], result
    by_task = {body["task_id"]: body["model"] for _, body in answers}
    for result, text in zip(results, [t for i in range(40) for t in (texts[default][i], texts[SMALL][i])]):
        assert by_task[result["task_id"]] == result["model"]
        assert result["outputs"] == expected_outputs(text)

    for name, rows in ((default, 64), (SMALL, 16)):
        after = await model_stats(client, name)
        calls = after["batches_dispatched"] - before[name]["batches_dispatched"]
        real = after["rows_dispatched"] - before[name]["rows_dispatched"]
        padded = after["padded_slots"] - before[name]["padded_slots"]
        assert real == 40 and after["calls_failed"] == before[name]["calls_failed"], (name, after)
        # Every call carried exactly the model's rows, real plus padding...
        assert real + padded == rows * calls, (name, calls, real, padded)
        # ... and Triton, which refuses any other row count, accepted each of them.
        success, failure = await triton_counts(stack, name)
        assert (success - triton_before[name][0], failure - triton_before[name][1]) == (calls, 0), name
        assert all(b["model"] == name and b["params"]["batch_size"] == rows for b in after["batchers"]), after
        # The metrics say so per model: each batcher labels every sample with its model.
        page = await metrics_page(batcher_metrics_url(stack, name))
        mine, before_mine = sample_sums(page, model=name), sample_sums(pages_before[name], model=name)
        assert mine["brimful_batch_rows_sum"] - before_mine.get("brimful_batch_rows_sum", 0) == 40, name
        assert mine["brimful_batch_rows_count"] - before_mine.get("brimful_batch_rows_count", 0) == calls, name
        assert sample_sums(page) == mine, f"{name}'s batcher exported a sample without its model"
        submitted = [
            sample_sums(text, model=name).get("brimful_tasks_submitted_total", 0)
            for text in (api_before, await metrics_page(stack.api_url))
        ]
        assert submitted[1] - submitted[0] == 40, name
    assert (await model_stats(client, SMALL))["batches_dispatched"] - before[SMALL]["batches_dispatched"] >= 3


async def test_one_models_stalled_batcher_does_not_delay_the_others(stack: EmbeddedStack, client: TaskClient) -> None:
    # The 16-row model's only batcher goes away: its tasks wait in its own topic, the
    # default model's still flow, and nothing waiting is lost when it comes back.
    name = next(n for n in stack.processes if n.startswith(f"batcher-{SMALL}"))
    stack.processes[name].stop()
    try:
        status, waiting = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": "held"}, "model": SMALL})
        assert status == 202, waiting
        for i in range(5):
            status, done = await client.request("POST", "/v1/tasks?wait=20", json={"inputs": {"TEXT": f"flows {i}"}})
            assert status == 200 and done["status"] == "done", done
        assert (await client.get(waiting["task_id"]))["status"] == "queued"
    finally:
        stack.restart(name)
    finished = await client.wait_final(waiting["task_id"], timeout_s=60)
    assert finished["status"] == "done" and finished["outputs"] == expected_outputs("held")


async def test_stats_and_policy_are_per_model(stack: EmbeddedStack, client: TaskClient) -> None:
    status, small = await client.request("GET", f"/v1/admin/policy?model={SMALL}")
    assert status == 200 and small["model"] == SMALL, small
    status, changed = await client.request(
        "PATCH", f"/v1/admin/policy?model={SMALL}", json={"min_wait_ms": small["params"]["min_wait_ms"] + 1}
    )
    assert status == 200, changed
    try:
        status, default = await client.request("GET", "/v1/admin/policy")
        assert status == 200 and default["model"] == stack.settings.model_name
        assert default["params"]["min_wait_ms"] == stack.settings.min_wait_ms  # the other model's is its own
        status, again = await client.request("GET", f"/v1/admin/policy?model={SMALL}")
        assert again["params"]["min_wait_ms"] == small["params"]["min_wait_ms"] + 1
    finally:
        status, _ = await client.request(
            "PATCH", f"/v1/admin/policy?model={SMALL}", json={"min_wait_ms": small["params"]["min_wait_ms"]}
        )
        assert status == 200
    for path in ("/v1/stats?model=nope", "/v1/admin/policy?model=nope"):
        status, body = await client.request("GET", path)
        assert status == 422 and body["error"]["code"] == "unknown_model", (path, body)


async def test_a_cancel_is_heard_by_its_own_models_batchers_only(stack: EmbeddedStack, client: TaskClient) -> None:
    keys = RedisKeys(stack.settings.key_prefix)
    redis = Redis.from_url(stack.settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.cancelled_channel, keys.model_cancelled_channel(SMALL))
    status, policy = await client.request("GET", f"/v1/admin/policy?model={SMALL}")
    held = {"min_wait_ms": 4000, "max_wait_ms": 4000}  # the task waits in its batcher while it is cancelled
    assert (await client.request("PATCH", f"/v1/admin/policy?model={SMALL}", json=held))[0] == 200

    async def applied(min_wait_ms: float) -> bool:  # batchers read the policy on a timer, not at once
        batchers = (await client.request("GET", f"/v1/stats?model={SMALL}"))[1]["batchers"]
        return bool(batchers) and all(abs(b["params"]["min_wait"] - min_wait_ms / 1000) < 1e-9 for b in batchers)

    try:
        await wait_for(lambda: applied(4000), 10, f"{SMALL}'s batchers to hold their rows 4 s", interval_s=0.05)
        text = f"cancelled in its own batcher {uuid.uuid4().hex}"
        status, body = await client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}, "model": SMALL})
        assert status == 202, body
        status, cancelled = await client.request("DELETE", f"/v1/tasks/{body['task_id']}")
        assert status == 200 and cancelled["status"] == "cancelled", cancelled
        heard = []
        deadline = asyncio.get_running_loop().time() + 2.0  # what either channel carries meanwhile
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if message is not None:
                heard.append((message["channel"].decode(), message["data"].decode()))
        assert heard == [(keys.model_cancelled_channel(SMALL), body["task_id"])]
    finally:
        restore = {name: policy["params"][name] for name in held}
        assert (await client.request("PATCH", f"/v1/admin/policy?model={SMALL}", json=restore))[0] == 200
        await wait_for(lambda: applied(restore["min_wait_ms"]), 10, f"{SMALL}'s batchers to let go", interval_s=0.05)
        await pubsub.aclose()
        await redis.aclose()
    assert text not in rows_seen_by_model(stack)

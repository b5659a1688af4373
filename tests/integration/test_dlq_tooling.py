"""On-call's DLQ commands, end to end on a real DLQ: list, show, export, replay, purge."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.stacks import fault_file
from tests.helpers.task_client import TaskClient


def brimful(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "brimful.cli", *args], capture_output=True, text=True, timeout=120)


async def test_dlq_list_show_export_replay_purge(stack: EmbeddedStack, client: TaskClient, tmp_path: Path) -> None:
    api = ("--api", stack.api_url)
    switch = fault_file(stack)
    switch.touch()  # the model now fails '!flaky' rows
    try:
        replay_id = await client.submit({"TEXT": "!flaky to replay"})
        purge_id = await client.submit({"TEXT": "!flaky to purge"})
        failed = await asyncio.gather(client.wait_final(replay_id), client.wait_final(purge_id))
        assert [task["status"] for task in failed] == ["failed", "failed"]
    finally:
        switch.unlink()  # the cause is removed

    listed = brimful("dlq", "list", *api, "--since", "10m", "--class", "model_error")
    assert listed.returncode == 0, listed.stderr
    first = listed.stdout.splitlines()[0]
    assert "dead letter(s)" in first and "model_error" in first  # the count and the error first
    assert replay_id in listed.stdout and purge_id in listed.stdout

    shown = brimful("dlq", "show", *api, replay_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("ERROR   model_error:")
    assert "'!flaky' row while the fault is switched on" in shown.stdout
    assert f"task    {replay_id}" in shown.stdout

    exported = tmp_path / "dlq.parquet"
    assert brimful("dlq", "export", *api, "--since", "10m", "--out", str(exported)).returncode == 0
    table = pq.read_table(exported)
    rows = {row["task_id"]: row for row in table.to_pylist()}
    assert {replay_id, purge_id} <= set(rows)
    assert rows[replay_id]["error_class"] == "model_error"
    # every call that carried the row: its own tries, plus a shared call if both landed in one batch
    assert rows[replay_id]["attempts"] >= stack.settings.max_attempts

    # Pages: one entry at a time, each page naming where the next starts.
    since = str(min(task["submitted_at_ms"] for task in failed))
    status, first = await client.request("GET", "/v1/admin/dlq", params={"since_ms": since, "limit": 1})
    assert status == 200 and len(first["entries"]) == 1 and first["next"] and first["count"] >= 2
    status, second = await client.request(
        "GET", "/v1/admin/dlq", params={"since_ms": since, "limit": 1, "after": first["next"]}
    )
    assert status == 200 and "count" not in second
    assert second["entries"][0]["id"] != first["entries"][0]["id"]

    dry = brimful("dlq", "replay", *api, replay_id, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would replay 1 task(s)" in dry.stdout and replay_id in dry.stdout
    assert (await client.get(replay_id))["status"] == "failed"  # a dry run sends nothing

    replayed = brimful("dlq", "replay", *api, replay_id)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 task(s)" in replayed.stdout
    task = await client.wait_final(replay_id)
    assert task["status"] == "done"
    assert task["outputs"] == expected_outputs("!flaky to replay")

    refused = brimful("dlq", "purge", *api, purge_id)
    assert refused.returncode == 1 and "--yes" in refused.stderr
    purged = brimful("dlq", "purge", *api, purge_id, "--yes")
    assert purged.returncode == 0 and "purged 1" in purged.stdout

    open_now = brimful("dlq", "list", *api, "--since", "10m")
    assert replay_id not in open_now.stdout and purge_id not in open_now.stdout
    everything = brimful("dlq", "list", *api, "--since", "10m", "--all")
    lines = {line.split()[-3]: line.split()[-1] for line in everything.stdout.splitlines()[2:]}
    assert lines[replay_id] == "replayed" and lines[purge_id] == "purged"
    again = brimful("dlq", "replay", *api, purge_id)
    assert "replayed 0 task(s)" in again.stdout  # a purged entry stays purged


async def test_dlq_http_refuses_vague_or_bad_requests(client: TaskClient) -> None:
    status, body = await client.request("POST", "/v1/admin/dlq/replay", json={})
    assert status == 422 and "say which entries" in body["error"]["message"]
    status, body = await client.request("GET", "/v1/admin/dlq", params={"since_ms": "yesterday"})
    assert status == 422 and "since_ms" in body["error"]["message"]
    status, body = await client.request("GET", "/v1/admin/dlq", params={"limit": "100001"})
    assert status == 422 and "limit" in body["error"]["message"]
    for after in ("../etc", "0-" + "9" * 30):
        status, body = await client.request("GET", "/v1/admin/dlq", params={"after": after})
        assert status == 422 and "after" in body["error"]["message"]
    # a place past the topic's end, or in a partition it does not have: an empty last page
    for after in ("0-99999999", "7770-0"):
        status, body = await client.request("GET", "/v1/admin/dlq", params={"after": after, "limit": 5})
        assert status == 200 and body == {"entries": [], "next": None}
    status, body = await client.request("GET", "/v1/admin/dlq", params={"colour": "red"})
    assert status == 422 and "colour" in body["error"]["message"]
    status, body = await client.request("GET", "/v1/admin/dlq/0-999999")
    assert status == 404

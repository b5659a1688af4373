"""The operator commands against a running stack, run as an operator would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs


def brimful(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "brimful.cli", *args], capture_output=True, text=True, timeout=120)


def test_tune_shows_changes_and_refuses_nonsense(stack: EmbeddedStack) -> None:
    api = ["--api", stack.api_url]
    shown = brimful("tune", *api)
    assert shown.returncode == 0, shown.stderr
    assert "max_wait_ms" in shown.stdout and "default" in shown.stdout
    changed = brimful("tune", *api, f"fill_slack={stack.settings.fill_slack + 0.25}")
    assert changed.returncode == 0, changed.stderr
    assert f"{stack.settings.fill_slack:g} -> {stack.settings.fill_slack + 0.25:g}" in changed.stdout
    restored = brimful("tune", *api, f"fill_slack={stack.settings.fill_slack}")
    assert restored.returncode == 0
    refused = brimful("tune", *api, "min_wait_ms=900", "max_wait_ms=100")
    assert refused.returncode == 1
    assert "min_wait" in refused.stderr
    malformed = brimful("tune", *api, "max_wait_ms")
    assert malformed.returncode == 1 and "NAME=VALUE" in malformed.stderr


def test_stats_once_shows_totals_partitions_and_endpoints(stack: EmbeddedStack) -> None:
    shown = brimful("stats", "--api", stack.api_url, "--once")
    assert shown.returncode == 0, shown.stderr
    assert "mean rows/batch" in shown.stdout
    for partition in range(stack.settings.topic_partitions):
        assert any(line.split()[1:2] == [str(partition)] for line in shown.stdout.splitlines()[3:]), shown.stdout
    for endpoint in stack.settings.triton_endpoints:
        row = next(line.split() for line in shown.stdout.splitlines() if endpoint in line)
        assert row[2].endswith(f"/{stack.settings.endpoint_capacity}") and row[4] == "closed", row


def test_unreachable_api_is_one_clear_line() -> None:
    result = brimful("stats", "--api", "http://127.0.0.1:9", "--once")
    assert result.returncode == 1
    assert result.stderr.startswith("brimful stats: cannot reach")


def test_simulate_generates_replays_and_plots_a_sweep(tmp_path: Path) -> None:
    trace = tmp_path / "bursty.parquet"
    generated = brimful("simulate", "--generate", "bursty", "--duration", "20", "--out", str(trace))
    assert generated.returncode == 0, generated.stderr
    plot = tmp_path / "sweep.png"
    swept = brimful("simulate", "--trace", str(trace), "--sweep", "max_wait_ms=20:200:4", "--plot", str(plot))
    assert swept.returncode == 0, swept.stderr
    rows = [line for line in swept.stdout.splitlines() if line.strip().startswith("max_wait_ms=")]
    assert len(rows) == 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = brimful("simulate", "--trace", str(trace), "--set", "min_wait_ms=999")
    assert refused.returncode == 1 and "min_wait" in refused.stderr
    around = brimful("simulate", "--trace", str(trace), "--call-ms", "30", "--around-ms", "15")
    assert around.returncode == 0 and "15 ms around it" in around.stdout, around.stderr
    for bad in ("-1", "nan", "inf"):
        refused = brimful("simulate", "--trace", str(trace), "--around-ms", bad)
        assert refused.returncode == 1 and "--around-ms" in refused.stderr, bad


def test_batches_create_waits_with_a_progress_bar_and_saves_the_files(stack: EmbeddedStack, tmp_path: Path) -> None:
    lines = [
        {"custom_id": f"cli-{n}", "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": f"cli {n % 3}"}}}
        for n in range(12)
    ]
    source = tmp_path / "job.jsonl"
    source.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines) + b"not json\n")
    api = ["--api", stack.api_url]
    made = brimful(
        "batches", "create", str(source), "--endpoint", "/v1/tasks", "--invalid-lines", "error_file",
        "--wait", "--out", str(tmp_path), *api,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    batch_id = made.stdout.splitlines()[0]
    assert f"{batch_id} [{'#' * 30}] 100.0% 13/13 (1 failed) completed" in made.stderr
    output = [orjson.loads(line) for line in (tmp_path / f"{batch_id}_output.jsonl").read_bytes().splitlines()]
    assert {line["custom_id"]: line["response"]["body"]["outputs"] for line in output} == {
        line["custom_id"]: expected_outputs(line["body"]["inputs"]["TEXT"]) for line in lines
    }
    assert "invalid_json_line" in (tmp_path / f"{batch_id}_error.jsonl").read_text()
    listed = brimful("batches", "list", *api)
    assert any(row.startswith(batch_id) and "completed" in row for row in listed.stdout.splitlines())
    assert brimful("batches", "cancel", batch_id, *api).returncode == 1  # ended already: 409, one line
    missing = brimful("batches", "create", str(tmp_path / "absent.jsonl"), "--endpoint", "/v1/tasks", *api)
    assert missing.returncode == 1 and "no file" in missing.stderr


def test_webhooks_are_added_listed_and_refused_inside_the_network(stack: EmbeddedStack) -> None:
    api = ["--api", stack.api_url]
    refused = brimful("webhooks", "add", "http://10.0.0.9/hook", "--events", "task.completed", *api)
    assert refused.returncode == 1 and "network" in refused.stderr
    # A public address, written as one: no name to resolve on a machine without DNS.
    added = brimful("webhooks", "add", "https://93.184.216.34/brimful", "--events", "batch.failed", *api)
    assert added.returncode == 0, added.stderr
    endpoint_id = added.stdout.split()[0]
    assert "secret: whsec_" in added.stdout
    assert endpoint_id in brimful("webhooks", "list", *api).stdout
    assert brimful("webhooks", "remove", endpoint_id, *api).returncode == 0
    assert endpoint_id not in brimful("webhooks", "list", *api).stdout
    assert brimful("webhooks", "deliveries", "--dead", *api).returncode == 0

"""The operator commands against a running stack, run as an operator would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from brimful.stack import EmbeddedStack


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

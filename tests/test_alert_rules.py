"""The alert rules in deploy/prometheus: valid for Prometheus, unit-tested with promtool,
and reading only metrics Brimful exports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.helpers.metric_names import exported_sample_names, referenced_names

RULES_DIR = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES = RULES_DIR / "brimful-alerts.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: scripts/bootstrap installs Debian's prometheus package"
    return subprocess.run([tool, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_rules() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    tested = promtool("test", "rules", "brimful-alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_reads_metrics_brimful_exports_and_says_what_to_do() -> None:
    exported = exported_sample_names()
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert len(rules) >= 7
    for rule in rules:
        names = referenced_names(rule["expr"])
        assert names, f"{rule['alert']} reads no Brimful metric"
        assert names <= exported, f"{rule['alert']} reads metrics nobody exports: {sorted(names - exported)}"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_operations_guide_says_what_each_alert_means() -> None:
    guide = (RULES_DIR.parent.parent / "docs" / "operations.md").read_text()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert f"| `{rule['alert']}` |" in guide, f"docs/operations.md does not explain {rule['alert']}"

"""The Grafana dashboard and the alert rules against a real Prometheus scraping the real
embedded stack: every panel's query is accepted and reads series that exist, grouped by
labels those series carry, so renaming a metric or a label breaks this test, not the
dashboard on-call opens at 3 a.m."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from brimful.stack import EmbeddedStack
from tests.helpers.metric_names import exported_sample_names, referenced_names
from tests.helpers.prometheus_server import query, running_prometheus, series
from tests.helpers.stacks import fault_file
from tests.helpers.task_client import TaskClient

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "brimful.json"
# What Grafana puts in place of its own variables before a query reaches Prometheus.
# The model picker's "All" is its allValue, ".*".
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "5m", "$model": ".*"}
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables filled in) for every target."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a variable this test does not fill: {expr}"
            found.append((panel["title"], expr))
    return found


@pytest.fixture(scope="module")
def prometheus(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    api = stack.api_url.removeprefix("http://")
    batchers = [
        f"127.0.0.1:{port}" for port in (stack.settings.batcher_metrics_port, *stack.batcher_metrics_ports.values())
    ]
    with running_prometheus(
        tmp_path_factory.mktemp("prometheus"), {"brimful-api": [api], "brimful-batcher": batchers}
    ) as url:
        yield url


@pytest.fixture
async def prom(prometheus: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=prometheus, timeout=10) as client:
        yield client


async def make_every_kind_of_event(stack: EmbeddedStack, client: TaskClient) -> None:
    """Traffic that gives every panel something to show: tasks, a dead letter with its
    retries, a refusal, and reads of finished tasks."""
    task_ids = await asyncio.gather(*(client.submit({"TEXT": f"dashboard {i}"}) for i in range(80)))
    switch = fault_file(stack)
    switch.touch()
    try:
        failing = await client.submit({"TEXT": "!flaky for the dashboard"})
        assert (await client.wait_final(failing))["status"] == "failed"
    finally:
        switch.unlink()
    await asyncio.gather(*(client.wait_final(t) for t in task_ids))
    status, _ = await client.request(
        "POST",
        "/v1/tasks",
        data=b"x" * (stack.settings.max_body_bytes + 1),
        headers={"Content-Type": "application/json"},
    )
    assert status == 413


async def wait_for_scrape(prom: httpx.AsyncClient, after: float) -> None:
    """Until Prometheus has scraped every process (the API and each batcher) since
    ``after`` (a Unix time)."""
    deadline = time.monotonic() + 30
    while True:
        answer = await prom.get("/api/v1/targets")
        targets = answer.json()["data"]["activeTargets"]
        fresh = [t for t in targets if t["health"] == "up" and _scraped_at(t) > after]
        if targets and len(fresh) == len(targets):
            return
        assert time.monotonic() < deadline, f"targets not scraped: {targets}"
        await asyncio.sleep(0.2)


def _scraped_at(target: dict[str, Any]) -> float:
    return datetime.fromisoformat(target["lastScrape"].replace("Z", "+00:00")).timestamp()


async def test_every_dashboard_query_reads_series_that_exist(
    stack: EmbeddedStack, client: TaskClient, prom: httpx.AsyncClient
) -> None:
    queries = panel_queries()
    assert len(queries) >= 20
    await make_every_kind_of_event(stack, client)
    await wait_for_scrape(prom, after=time.time() + 1.5)  # a scrape that began after the events

    exported = exported_sample_names()
    labels_of: dict[str, set[str]] = {}
    for title, expr in queries:
        names = referenced_names(expr)
        assert names, f"{title}: reads no Brimful metric"
        assert names <= exported, f"{title}: reads metrics nobody exports: {sorted(names - exported)}"
        for name in names:
            if name not in labels_of:
                found = await series(prom, name)
                assert found, f"{title}: Prometheus holds no series of {name}"
                labels_of[name] = {label for one in found for label in one}
        grouping = {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        carried = set().union(*(labels_of[name] for name in names))
        assert grouping <= carried, f"{title}: groups by labels its metrics do not carry: {sorted(grouping - carried)}"
        await query(prom, expr)  # Prometheus accepts it


async def test_the_alert_rules_load_and_evaluate_against_the_live_metrics(prom: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 30
    while True:
        answer = await prom.get("/api/v1/rules")
        groups = answer.json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if rules and all(
            rule.get("lastEvaluation", "").startswith("2") and not rule["lastEvaluation"].startswith("0001")
            for rule in rules
        ):
            break
        assert time.monotonic() < deadline, f"rules never evaluated: {rules}"
        await asyncio.sleep(0.2)
    assert len(rules) >= 7
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"

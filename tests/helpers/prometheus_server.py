"""A real Prometheus (Debian's package, installed by scripts/bootstrap) for the tests:
scraping the targets it is given every second, with Brimful's alert rules loaded."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from brimful.stack.processes import free_port

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "brimful-alerts.yml"


@contextmanager
def running_prometheus(workdir: Path, targets: dict[str, list[str]]) -> Iterator[str]:
    """Prometheus scraping ``targets`` (job name: host:port list) each second; yields its URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/bootstrap installs Debian's prometheus package"
    assert RULES.is_file(), f"no alert rules at {RULES}"  # Prometheus would run without them, silently
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": addresses}]} for job, addresses in targets.items()
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready after 30 s"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def query(client: httpx.AsyncClient, promql: str) -> list[dict[str, Any]]:
    """An instant query's result; fails the test on a query Prometheus rejects."""
    answer = await client.get("/api/v1/query", params={"query": promql})
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "success", f"{promql}: {body.get('error', body)}"
    return list(body["data"]["result"])


async def series(client: httpx.AsyncClient, name: str) -> list[dict[str, str]]:
    """Every series of a metric Prometheus holds."""
    answer = await client.get("/api/v1/series", params={"match[]": name})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["data"])

"""Prometheus pages scraped from the API, the batchers and Triton."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from brimful.stack import EmbeddedStack, sample_sums
from tests.helpers.task_client import TaskClient


async def triton_counts(stack: EmbeddedStack, name: str) -> tuple[int, int]:
    """(successful, failed) calls Triton itself counted for one model."""
    counts = sample_sums(await metrics_page(f"http://127.0.0.1:{stack.triton_metrics_port}"), model=name)
    return int(counts["nv_inference_request_success_total"]), int(counts["nv_inference_request_failure_total"])


async def metrics_page(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        return await response.text()


def batcher_metrics_url(stack: EmbeddedStack, model: str) -> str:
    port = stack.batcher_metrics_ports.get(model, stack.settings.batcher_metrics_port)
    return f"http://127.0.0.1:{port}"


async def model_stats(client: TaskClient, name: str) -> dict[str, Any]:
    status, body = await client.request("GET", f"/v1/stats?model={name}")
    assert status == 200 and body["model"] == name, body
    return body


async def metric_values(url: str) -> dict[str, float]:
    """Sum each sample name across labels from a Prometheus text page."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return sample_sums(await response.text())


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)

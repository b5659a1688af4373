"""A batcher's metrics page labels every sample with its model, keeping a sample's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from brimful.core.metrics_exposition import exposition_with_labels


def samples(text: bytes) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    ]


def test_every_sample_gains_the_label_and_keeps_its_value() -> None:
    registry = CollectorRegistry()
    flushes = Counter("flushes", "why batches left", ["reason"], registry=registry)
    rows = Histogram("rows", "rows a call", buckets=(16, 64), registry=registry)
    flushes.labels("full").inc(3)
    rows.observe(20)
    found = samples(exposition_with_labels({"model": "m16"}, registry)())
    assert ("flushes_total", {"model": "m16", "reason": "full"}, 3.0) in found
    assert ("rows_bucket", {"model": "m16", "le": "64.0"}, 1.0) in found
    assert ("rows_sum", {"model": "m16"}, 20.0) in found
    assert all(labels.get("model") == "m16" for _, labels, _ in found)


def test_a_sample_that_names_its_own_model_keeps_it() -> None:
    registry = CollectorRegistry()
    letters = Counter("letters", "dead letters", ["model"], registry=registry)
    letters.labels("other").inc()
    found = samples(exposition_with_labels({"model": "m16"}, registry)())
    assert ("letters_total", {"model": "other"}, 1.0) in found
    assert ("letters_total", {"model": "m16"}, 1.0) not in found


def test_values_are_read_at_each_render() -> None:
    registry = CollectorRegistry()
    calls = Counter("calls", "model calls", registry=registry)
    render = exposition_with_labels({"model": "m"}, registry)
    calls.inc()
    first = render()
    calls.inc()
    assert ("calls_total", {"model": "m"}, 1.0) in samples(first)
    assert ("calls_total", {"model": "m"}, 2.0) in samples(render())

"""Observing a batch's values at once exports what observing them one at a time does."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from brimful.workers.batch import observe_all

BUCKETS = (0.001, 0.01, 0.1, 1.0)
# On a bound, between bounds, below the first, past the last, zero, repeated.
VALUES = [0.001, 0.01, 0.0005, 0.05, 0.05, 1.0, 7.5, 0.0, 0.1, 0.3]


def exposition(registry: CollectorRegistry) -> list[str]:
    """The samples, the sum rounded: added once a batch, it is the same sum in another
    order, equal but for the last bits. The creation time differs between registries."""
    lines = []
    for line in generate_latest(registry).decode().splitlines():
        if "_sum" in line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            line = f"{name} {float(value):.9f}"
        if "_created" not in line:
            lines.append(line)
    return lines


def pair(labels: tuple[str, ...] = ()) -> tuple[Histogram, Histogram, CollectorRegistry, CollectorRegistry]:
    one, many = CollectorRegistry(), CollectorRegistry()
    kwargs = {"buckets": BUCKETS, "labelnames": labels}
    return Histogram("h", "h", registry=one, **kwargs), Histogram("h", "h", registry=many, **kwargs), one, many


def test_the_samples_are_those_of_one_observation_a_value() -> None:
    single, batched, one, many = pair()
    for value in VALUES:
        single.observe(value)
    observe_all(batched, VALUES[:4])
    observe_all(batched, VALUES[4:])
    observe_all(batched, [])
    assert exposition(many) == exposition(one)
    assert 'h_bucket{le="0.01"} 4.0' in exposition(many)  # 0.001, 0.01 (on its bound), 0.0005, 0.0
    assert "h_count 10.0" in exposition(many)


def test_a_labelled_child_is_fed_and_an_unlabelled_parent_refused_as_observe_refuses_it() -> None:
    single, batched, one, many = pair(("partition",))
    for value in VALUES:
        single.labels("3").observe(value)
    observe_all(batched.labels("3"), VALUES)
    assert exposition(many) == exposition(one)
    with pytest.raises(ValueError, match=r"(?i)label"):
        observe_all(batched, [0.5])

"""The sample names Brimful exports (from core/metrics.py) and the ones a PromQL text uses,
so a rule or dashboard query naming a metric that no longer exists fails a test."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY

import brimful.core.metrics  # noqa: F401 - registers every metric

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
_NAME = re.compile(r"\bbrimful_[a-z0-9_]+")


def exported_sample_names() -> set[str]:
    """Every sample name a Brimful process can put on its /metrics page."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("brimful_"):
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def referenced_names(promql: str) -> set[str]:
    """The brimful_* metric names a query reads."""
    return set(_NAME.findall(promql))

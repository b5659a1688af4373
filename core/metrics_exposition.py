"""The text a process serves on ``/metrics``, with labels that hold for the whole process.

A batcher serves one model, so every sample it exports belongs to that model: rather than
thread the model's name through every metric call, the exposition adds a ``model`` label to
each sample that does not carry one already (the dead-letter counter names its own).
Prometheus can then sum, alert and draw per model across batchers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class _LabelledCollector(Collector):
    """Every metric of ``source``, each sample with ``labels`` added where it lacks them."""

    def __init__(self, source: CollectorRegistry, labels: dict[str, str]) -> None:
        self._source = source
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [sample._replace(labels={**self._labels, **sample.labels}) for sample in family.samples]
            yield labelled


def exposition_with_labels(labels: dict[str, str], source: CollectorRegistry = REGISTRY) -> Callable[[], bytes]:
    """A function that renders ``source``'s metrics, every sample carrying ``labels``
    (a sample's own label of the same name wins)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_LabelledCollector(source, labels))
    return lambda: generate_latest(registry)

"""Reading a component's Prometheus /metrics page (the API's, the batcher's, Triton's),
for the tests and the benchmarks that check a figure from the component's own side."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def sample_sums(text: str, **labels: str) -> dict[str, float]:
    """Each sample's value summed over its series whose labels include ``labels``.

    Names are the parser's: every counter's samples end in ``_total``, also where the page
    itself leaves it off (Triton's ``nv_inference_count`` reads ``nv_inference_count_total``).
    """
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if all(sample.labels.get(key) == value for key, value in labels.items()):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def read_sample_sums(url: str, **labels: str) -> dict[str, float]:
    """``sample_sums`` of the page at ``url`` (a blocking read, bounded at 5 s)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return sample_sums(response.read().decode(), **labels)

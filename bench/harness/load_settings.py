"""The embedded stack's settings for a load benchmark: no rate limit, no in-flight quota and
no backlog limit (the benchmark is the only client and means to push), results kept ten
minutes, and the model served with ``instances`` instances and one more slot that queues
the next call behind them (as ``make bench`` runs it)."""

from __future__ import annotations

from bench.harness.throughput_plan import API_WORKERS, BenchModel
from brimful.core.settings import Settings
from brimful.stack import settings_on_free_ports


def load_settings(
    model: BenchModel, api_workers: int = API_WORKERS, instances: int = 1, **overrides: object
) -> Settings:
    """Settings on free ports for a load benchmark of ``model``; ``overrides`` win."""
    values: dict[str, object] = {
        "rate_limit_per_s": 0,
        "tenant_max_in_flight": 0,
        "max_backlog": 10_000_000,
        "result_ttl_s": 600,
        "api_workers": api_workers,
        "model_name": model.model_name,
        "endpoint_instances": instances,
        "endpoint_capacity": instances + 1,
    }
    return settings_on_free_ports(**{**values, **overrides})

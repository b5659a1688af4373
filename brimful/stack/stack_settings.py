"""The settings a local stack's processes run with: on free loopback ports, and passed to
each child as BRIMFUL_* environment variables."""

from __future__ import annotations

import os

from pydantic import SecretStr

from brimful.core.settings import Settings
from brimful.stack.processes import free_port

TANSU_SESSION_TIMEOUT_MS = 3000


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process exactly these settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BRIMFUL_")}
    for name, value in settings.model_dump().items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"BRIMFUL_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def settings_on_free_ports(**overrides: object) -> Settings:
    """Settings for a stack of its own on free loopback ports, beside any other (tests and
    benchmarks run several). Open (auth off), as the embedded stack runs, unless overridden."""
    values: dict[str, object] = {
        "kafka_bootstrap": f"127.0.0.1:{free_port()}",
        "redis_url": f"redis://127.0.0.1:{free_port()}/0",
        "triton_url": f"127.0.0.1:{free_port()}",
        "triton_http_port": free_port(),
        "triton_metrics_port": free_port(),
        "api_port": free_port(),
        "batcher_metrics_port": free_port(),
        "auth_enabled": False,
        # Tansu holds a group join for half the session: a short one keeps rebalances quick.
        # A stack on Apache Kafka raises it to the broker's least (EmbeddedStack.start_kafka).
        "kafka_session_timeout_ms": TANSU_SESSION_TIMEOUT_MS,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]

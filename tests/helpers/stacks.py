"""Stacks of their own for tests: settings on free ports, the production-shape and durable
stacks the fault tests break, and what a stack's model saw."""

from __future__ import annotations

from pathlib import Path

from brimful.core.settings import Settings
from brimful.stack import EmbeddedStack, free_port, settings_on_free_ports


def stack_settings(**overrides: object) -> Settings:
    """Settings for a stack of its own, on free loopback ports (auth off unless overridden)."""
    return settings_on_free_ports(**overrides)


def start_stack(workdir: Path, settings: Settings, **options: object) -> EmbeddedStack:
    stack = EmbeddedStack(settings, workdir, **options)  # type: ignore[arg-type]
    stack.start()
    return stack


def add_second_batchers(stack: EmbeddedStack, models: list[str]) -> None:
    """A second batcher of each model, sharing its partitions with the first; returns once
    every partition is owned."""
    for model in models:
        stack.start_batcher(model=model)
    stack.wait_for_batchers()


def api_workers(stack: EmbeddedStack) -> list[int]:
    """The pids of the API's worker processes: its supervisor's children that serve, not
    multiprocessing's resource tracker beside them (none when one worker runs in the API's
    own process)."""
    pid = stack.processes["api"].pid
    if pid is None:
        return []
    workers: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    for child in children:
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                workers.append(int(child))
        except OSError:  # gone meanwhile
            continue
    return workers


def rows_seen_by_model(stack: EmbeddedStack) -> list[str]:
    """Every real row the stack's model has been given so far."""
    path = stack.workdir / "model-seen.log"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def fault_file(stack: EmbeddedStack) -> Path:
    """While this file exists, the stack's model fails rows starting with '!flaky'."""
    return stack.workdir / "model-fault"


WIDE_PARTITIONS = 4


MODEL_CALL_MS = 100  # full batches: 640 rows/s at most, so a flood can outrun it


MAX_BACKLOG = 300


def durable_stack(workdir: Path, s3_server: str, model_host_args: tuple[str, ...], **settings: object) -> EmbeddedStack:
    """A stack that keeps what it accepted across restarts, as production does: the broker
    on the local S3 server, Redis with AOF."""
    return start_stack(
        workdir,
        stack_settings(
            infer_timeout_s=1.5,
            breaker_max_open_s=1.0,
            kafka_request_timeout_ms=5000,
            kafka_fetch_max_wait_ms=500,  # Tansu on S3 answers shorter fetch waits with nothing, forever
            kafka_fetch_lagging_max_wait_ms=2500,  # at most half the request timeout
            **settings,
        ),
        model_host_args=model_host_args,
        redis_append_only=True,
        broker_storage="s3://tansu/",
        broker_env=s3_broker_env(s3_server),
    )


def s3_broker_env(s3_server: str) -> dict[str, str]:
    """What the broker needs to keep its log on the local S3 server."""
    return {
        "AWS_ENDPOINT": s3_server,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "brimful",
        "AWS_SECRET_ACCESS_KEY": "brimful",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def start_wide_stack(workdir: Path, **settings: object) -> EmbeddedStack:
    """A stack in the production shape the embedded one lacks: the requests topic on
    WIDE_PARTITIONS partitions and two model endpoints of two slots each, the model host
    logging every row it computes (``rows_seen_by_model``)."""
    base = stack_settings(topic_partitions=WIDE_PARTITIONS, endpoint_capacity=2, **settings)
    two_endpoints = base.model_copy(update={"triton_url": f"{base.triton_url},127.0.0.1:{free_port()}"})
    return start_stack(workdir, two_endpoints, model_host_args=("--seen-log", str(workdir / "model-seen.log")))


SMALL = "brimful_reference_16"  # the shared stack's second model, fixed at 16 rows

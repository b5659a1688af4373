"""Shared fixtures: the real stacks the integration tests share: ``stack`` on Apache Kafka
(the broker production runs, one KRaft node), ``openai_stack`` on Tansu (the broker ``make
up`` embeds), each with Redis, Triton, the API and batchers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from brimful.commands.up import EMBEDDED_MODELS
from brimful.core.api_keys import ApiKeys, Scope
from brimful.core.redis_client import make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING_MODEL
from brimful.stack import EmbeddedStack
from brimful.stack.kafka_jars import DEFAULT_KAFKA_VERSION
from tests.helpers.live_policy import applied, tune
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """The whole default pipeline on loopback, serving the models ``make up`` serves,
    shared by the integration tests."""
    workdir = tmp_path_factory.mktemp("stack")
    running = start_stack(
        workdir,
        # The second model marked not deterministic: its tasks never share a result.
        stack_settings(
            trace_dir=str(workdir / "traces"), models=EMBEDDED_MODELS, uncacheable_models="brimful_reference_16"
        ),
        model_host_args=("--fault-file", str(workdir / "model-fault"), "--seen-log", str(workdir / "model-seen.log")),
        kafka_version=DEFAULT_KAFKA_VERSION,
    )
    yield running
    running.stop()


# The OpenAI-compatible routes' stack, in production shape: auth on, two API workers, two
# partitions, every model make up serves; small limits, so tests reach them.
OPENAI_MAX_INPUTS = 50
OPENAI_MAX_FILE_BYTES = 2_000_000
OPENAI_JOB_WINDOW = 8
OPENAI_WEBHOOK_RETRY_S = 0.3


@pytest.fixture(scope="session")
def openai_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("openai-stack"),
        stack_settings(
            auth_enabled=True,
            api_workers=2,
            topic_partitions=2,
            models=EMBEDDED_MODELS,
            max_bulk_tasks=OPENAI_MAX_INPUTS,
            file_max_bytes=OPENAI_MAX_FILE_BYTES,
            batch_job_window=OPENAI_JOB_WINDOW,
            webhook_allowed_hosts="127.0.0.1",  # the tests' receivers
            webhook_retry_delays_s=",".join([str(OPENAI_WEBHOOK_RETRY_S)] * 3),
            shortenable_embedding_models=EMBEDDING_MODEL,  # declared Matryoshka: it answers shorter dimensions
        ),
    )
    yield running
    running.stop()


@pytest.fixture(scope="session")
async def openai_keys(openai_stack: EmbeddedStack) -> dict[str, str]:
    """API keys by what they may do, issued as `brimful keys create` issues them."""
    redis = make_redis(openai_stack.settings)
    try:
        issuer = ApiKeys(redis, RedisKeys(openai_stack.settings.key_prefix))
        return {
            "submit": (await issuer.create("embedder", [Scope.SUBMIT, Scope.READ]))[0],
            "other": (await issuer.create("another-tenant", [Scope.SUBMIT, Scope.READ]))[0],
            "read": (await issuer.create("reader", [Scope.READ]))[0],
            "admin": (await issuer.create("embedder", [Scope.ADMIN]))[0],  # the first key's tenant
            "other-admin": (await issuer.create("another-tenant", [Scope.ADMIN]))[0],
        }
    finally:
        await redis.aclose()


@pytest.fixture
async def client(stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(stack.api_url) as task_client:
        yield task_client


@pytest.fixture
async def restore_policy(stack: EmbeddedStack, client: TaskClient) -> AsyncIterator[None]:
    """Put the defaults back after a test that tunes, so other tests see them."""
    yield
    s = stack.settings
    status, body = await tune(
        client,
        max_wait_ms=s.max_wait_ms,
        min_wait_ms=s.min_wait_ms,
        latency_target_ms=s.latency_target_ms,
        rate_halflife_ms=s.rate_halflife_ms,
        fill_slack=s.fill_slack,
        min_worthwhile_rows=s.min_worthwhile_rows,
        low_max_wait_ms=s.low_max_wait_ms,
    )
    assert status == 200, body
    await wait_for(
        lambda: applied(client, {"max_wait_ms": s.max_wait_ms / 1000}), 5, "the defaults back", interval_s=0.05
    )


_MARK_BY_FOLDER = {"unit": "unit", "integration": "integration", "faults": "faults", "fuzz": "fuzz"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder (see pyproject's markers); tests/*.py are artefacts."""
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        item.add_marker(_MARK_BY_FOLDER.get(folder, "artefacts"))

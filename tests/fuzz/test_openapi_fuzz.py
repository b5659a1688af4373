"""Schemathesis fuzzes the live API (auth on, as in production) from its own OpenAPI
document: no request may get a 5xx, and every response must match the document."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from brimful.commands.up import EMBEDDED_MODELS
from brimful.stack import EmbeddedStack, settings_env
from tests.helpers.stacks import stack_settings, start_stack

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "missing_required_header",
        "ignored_auth",
    ]
)


@pytest.fixture(scope="module")
def secured_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    # Every model make up serves, so the embeddings route is fuzzed against a real embedding model.
    running = start_stack(
        tmp_path_factory.mktemp("fuzz-stack"), stack_settings(auth_enabled=True, models=EMBEDDED_MODELS)
    )
    yield running
    running.stop()


def test_fuzzing_finds_no_server_error_and_no_departure_from_the_document(secured_stack: EmbeddedStack) -> None:
    env = settings_env(secured_stack.settings)
    key = subprocess.run(
        [sys.executable, "-m", "brimful.cli", "keys", "create", "--tenant", "fuzz", "--scopes", "submit,read,admin"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    schemathesis = Path(sys.executable).parent / "st"
    run = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{secured_stack.api_url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            "25",
            "-H",
            f"Authorization: Bearer {key}",
            "--no-color",
            # longer than the longest ?wait= the API allows, so a held request is not a "timeout"
            "--request-timeout",
            str(secured_stack.settings.long_poll_max_s + 10),
            # a fixed seed: CI runs the same cases every time (change it to explore further)
            "--seed",
            "20261122",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:]

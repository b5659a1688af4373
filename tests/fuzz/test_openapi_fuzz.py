"""Schemathesis fuzzes the live API (auth on, as in production) from its own OpenAPI
document: no request may get a 5xx, and every response must match the document."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import hypothesis
import hypothesis.strategies as st
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


def cli_key(stack: EmbeddedStack, tenant: str) -> str:
    """A key with every tenant scope, made as an operator makes one: ``brimful keys create``."""
    return subprocess.run(
        [sys.executable, "-m", "brimful.cli", "keys", "create", "--tenant", tenant, "--scopes", "submit,read,admin"],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_fuzzing_finds_no_server_error_and_no_departure_from_the_document(secured_stack: EmbeddedStack) -> None:
    key = cli_key(secured_stack, "fuzz")
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


# Why the run above missed ``?limit=²`` and ``1e400``: its negative cases for an integer
# parameter are strings of arbitrary characters, which reach a Unicode digit that
# ``str.isdigit`` takes and ``int`` refuses about never in 25 examples; and it draws JSON
# from Python values, so a number past any float (``1e400``) is never written. The test
# below aims at that class on purpose: every query, path and top-level body parameter of
# every JSON route in the document, given numbers in every script, numbers past every
# bound, non-finite spellings, control and format characters, and JSON tokens Python
# reads as infinity.
HOSTILE_TEXT = st.one_of(
    st.text(alphabet=st.characters(categories=("Nd", "No", "Nl")), min_size=1, max_size=6),
    st.sampled_from(
        ["²", "١٠", "𝟗", "1²", "⁵", "nan", "inf", "-inf", "1e400", "-0", "9" * 40, "0x10", " 5", "+5", "1_000",
         "\x00", "\u202e", "%00", "-1", "1.5", "", "٣h", "²h", "1e400h"]
    ),
    st.text(max_size=12),
)  # fmt: skip
HOSTILE_JSON = st.one_of(
    HOSTILE_TEXT.map(lambda text: json.dumps(text)),
    st.sampled_from(
        ["1e400", "-1e400", "1e-400", "123456789012345678901234567890", "-1", "true", "null", "[]", "{}", "1.5",
         '"\\ud800"', "[1e400]", '{"a": 1e400}']
    ),
)  # fmt: skip


def _operations(document: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(method, path, where, name) for each parameter and JSON body field of the document."""
    found = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] in ("query", "path"):
                    found.append((method.upper(), path, parameter["in"], parameter["name"]))
            schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            if "$ref" in schema:
                schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
            for name in schema.get("properties", {}):
                found.append((method.upper(), path, "body", name))
    return found


def test_hostile_values_in_every_parameter_get_no_server_error(secured_stack: EmbeddedStack) -> None:
    key = cli_key(secured_stack, "hostile")
    with httpx.Client(base_url=secured_stack.api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        operations = _operations(http.get("/openapi.json").json())
        assert len(operations) > 40  # every route's parameters, not a few

        @hypothesis.settings(max_examples=500, deadline=None, database=None, derandomize=True)
        @hypothesis.given(operation=st.sampled_from(operations), text=HOSTILE_TEXT, token=HOSTILE_JSON)
        def no_server_error(operation: tuple[str, str, str, str], text: str, token: str) -> None:
            method, path, where, name = operation
            params: dict[str, str] = {}
            content: bytes | None = None
            if where == "path":
                path = path.replace("{" + name + "}", quote(text, safe="") or "x")
            elif where == "query":
                params[name] = text
            else:
                content = b'{"%s": %s}' % (name.encode(), token.encode())
            path = re.sub(r"\{[^}]+\}", "x", path)  # other path parameters: a plain unknown id
            answer = http.request(
                method, path, params=params, content=content, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code < 500, (operation, text, token, answer.status_code, answer.text[:300])

        no_server_error()

"""The model host starts its server again when a load misses PyTriton's handshake window,
and only then (the decision alone: Triton's own start is covered by the integration tests)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from brimful.model_server import model_host


def run_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failures: list[str]) -> list[Path]:
    """model_host.main() with ``serve`` failing with each of ``failures`` in turn; the
    workspaces each start was given."""
    workspaces: list[Path] = []

    def serve(workspace: Path, **options: Any) -> None:
        workspaces.append(workspace)
        if len(workspaces) <= len(failures):
            raise InferenceServerException(failures[len(workspaces) - 1])

    monkeypatch.setattr(model_host, "serve", serve)
    monkeypatch.setattr(sys, "argv", ["model_host", "--workspace", str(tmp_path / "ws"), "--instances", "2"])
    model_host.main()
    return workspaces


# The two ways PyTriton's load reports a missed handshake, as its errors read.
MISSED = [
    "load failed for model 'brimful_reference': Timeout occurred while waiting for config file /x/config.sock",
    "load failed for model 'brimful_reference': version 1 is at UNAVAILABLE state: Internal: TritonModelException: "
    'Model initialize error: Traceback (most recent call last):\n  File "/tmp/f/1/model.py", line 425, in '
    "initialize\n    inference_handler_config = get_config_from_handshake_server(handshake_socket)\n"
    "ConnectionRefusedError: [Errno 111] Connection refused",
]


@pytest.mark.parametrize("missed", MISSED, ids=["timed out", "refused"])
def test_a_missed_handshake_starts_the_server_again_in_a_new_workspace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missed: str
) -> None:
    workspaces = run_main(monkeypatch, tmp_path, [missed])
    assert workspaces == [tmp_path / "ws", tmp_path / "ws-2"]


def test_the_starts_are_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missed = MISSED[1]
    with pytest.raises(InferenceServerException):
        run_main(monkeypatch, tmp_path, [missed] * model_host.LOAD_STARTS)


def test_another_load_failure_is_raised_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(InferenceServerException, match="bad config"):
        run_main(monkeypatch, tmp_path, ["load failed: bad config"])

"""The reference model's hang file: a call waits while the file exists and answers its own
rows once it is gone (the soak's hung endpoint)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import numpy as np

from brimful.model_server.reference_model import ReferenceModel, hang_file_at


async def test_a_call_waits_while_the_hang_file_exists_then_answers_its_own_rows(tmp_path: Path) -> None:
    hang = tmp_path / "hang"
    hang.touch()
    model = ReferenceModel(hang_file=hang)
    rows = np.array([[b"first"], [b"second"]], dtype=object)
    call = asyncio.ensure_future(asyncio.to_thread(model, rows))
    done, _ = await asyncio.wait({call}, timeout=0.5)
    assert not done, "the call answered while the hang file existed"
    hang.unlink()
    outputs = await asyncio.wait_for(call, timeout=5)
    assert [bytes(value).decode() for value in outputs["SHA256"].reshape(-1)] == [
        hashlib.sha256(b"first").hexdigest(),
        hashlib.sha256(b"second").hexdigest(),
    ]


def test_each_host_of_a_stack_has_its_own_hang_file(tmp_path: Path) -> None:
    template = tmp_path / "hang-{grpc_port}"
    assert hang_file_at(template, 8001) == tmp_path / "hang-8001"
    assert hang_file_at(template, 8001) != hang_file_at(template, 8011)

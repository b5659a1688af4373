"""The reference model as Triton serves it: exactly 64 rows, correct digests, the fault hook."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from brimful.stack import EmbeddedStack
from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.triton_model import TritonModel


@pytest.fixture
async def model(stack: EmbeddedStack):
    settings = stack.settings
    clients: list[TritonModel] = []

    def make() -> TritonModel:
        client = TritonModel(settings.triton_url, settings.model_name, "", timeout_s=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def texts(rows: int, first: bytes = b"row") -> np.ndarray:
    values = [first] + [f"row {i} ✓".encode() for i in range(1, rows)]
    array = np.empty((rows, 1), dtype=object)
    array[:, 0] = values
    return array


async def test_64_rows_give_each_row_its_own_digest_and_length(model) -> None:
    client = model()
    signature = await client.signature()
    assert signature.input_names == ("TEXT",)
    assert signature.batch_size == 64
    inputs = texts(64)
    outputs = await client.infer({"TEXT": inputs}, signature)
    for row in range(64):
        data = inputs[row, 0]
        assert outputs["SHA256"][row, 0].decode() == hashlib.sha256(data).hexdigest()
        assert outputs["LENGTH"][row, 0] == len(data)


@pytest.mark.parametrize("rows", [1, 32, 63, 65, 128])
async def test_triton_rejects_any_other_number_of_rows(model, stack: EmbeddedStack, rows: int) -> None:
    client = model()
    # A signature that says ``rows``: the client's own row check passes, to reach Triton's.
    signature = replace(await client.signature(), batch_size=rows)
    with pytest.raises(ModelCallError) as raised:
        await client.infer({"TEXT": texts(rows)}, signature)
    assert raised.value.error_class is ErrorClass.REJECTED
    assert "Expected [64,1]" in raised.value.message


async def test_fault_hook_fails_the_call_with_a_model_error(model) -> None:
    client = model()
    signature = await client.signature()
    with pytest.raises(ModelCallError) as raised:
        await client.infer({"TEXT": texts(64, first=b"!fail here")}, signature)
    assert raised.value.error_class is ErrorClass.MODEL_ERROR
    assert "!fail" in raised.value.message
    assert "Traceback" not in raised.value.message  # summarised for people, not dumped


async def test_unreachable_server_is_classified_unavailable() -> None:
    from brimful.stack import free_port

    client = TritonModel(f"127.0.0.1:{free_port()}", "brimful_reference", "", timeout_s=2)
    try:
        with pytest.raises(ModelCallError) as raised:
            await client.signature()
        assert raised.value.error_class is ErrorClass.UNAVAILABLE
        assert not await client.is_ready()
    finally:
        await client.close()

"""A model server's garbled answer is a classified model error, never an exception the
batch runner does not expect: read through tritonclient's own InferResult, built from the
protobuf answer a server sends."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2

from brimful.workers.model_errors import ErrorClass, ModelCallError
from brimful.workers.triton_model import answered


def answer(outputs: list[tuple[str, str, list[int], bytes]]) -> InferResult:
    response = service_pb2.ModelInferResponse()
    for name, datatype, shape, raw in outputs:
        output = response.outputs.add()
        output.name = name
        output.datatype = datatype
        output.shape.extend(shape)
        response.raw_output_contents.append(raw)
    return InferResult(response)


def test_a_whole_answer_is_read_as_its_rows() -> None:
    lengths = np.arange(4, dtype=np.int64).reshape(4, 1)
    array = answered(answer([("LENGTH", "INT64", [4, 1], lengths.tobytes())]), "LENGTH", rows=4)
    assert array.tolist() == lengths.tolist()


@pytest.mark.parametrize(
    ("outputs", "found"),
    [
        # Bytes that do not fill the shape the answer declares (seen after a host's SIGCONT).
        ([("SHA256", "BYTES", [4, 1], b"")], "cannot reshape"),
        # Rows other than the call's: unpadding would pair outputs with the wrong tasks.
        ([("SHA256", "INT64", [2, 1], np.zeros(2, dtype=np.int64).tobytes())], "of shape [2, 1], for a call of 4 rows"),
        ([("OTHER", "INT64", [4, 1], np.zeros(4, dtype=np.int64).tobytes())], "SHA256 is missing"),
    ],
)
def test_a_garbled_answer_is_a_model_error_naming_what_is_wrong(
    outputs: list[tuple[str, str, list[int], bytes]], found: str
) -> None:
    with pytest.raises(ModelCallError) as raised:
        answered(answer(outputs), "SHA256", rows=4)
    assert raised.value.error_class is ErrorClass.MODEL_ERROR
    assert "malformed" in raised.value.message and found in raised.value.message

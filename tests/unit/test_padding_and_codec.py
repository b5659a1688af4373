"""Padding to the fixed batch size, and JSON <-> wire <-> numpy conversions."""

from __future__ import annotations

import numpy as np
import pytest

from brimful.core.model_catalogue import (
    InputValidationError,
    ModelSignature,
    TensorSpec,
    UnsupportedModelError,
    encode_input,
    fixed_batch_size,
    non_finite_rows,
    output_rows_to_json,
    row_mismatch,
    stack_rows,
)
from brimful.schemas import InputTensor
from brimful.workers.triton_model import pad_batch, pad_rows, unpad

TEXT = TensorSpec("TEXT", "BYTES", (1,))
VECTOR = TensorSpec("V", "FP32", (3,))
COUNT = TensorSpec("N", "INT8", (1,))


def test_pad_rows_fills_to_the_batch_size_with_neutral_rows() -> None:
    texts = np.array([[b"a"], [b"b"]], dtype=object)
    padded = pad_rows(texts, 64)
    assert padded.shape == (64, 1)
    assert padded[:2, 0].tolist() == [b"a", b"b"]
    assert set(padded[2:, 0].tolist()) == {b""}
    numbers = pad_rows(np.ones((3, 4), dtype=np.float32), 8)
    assert numbers.shape == (8, 4) and numbers[3:].sum() == 0


def test_pad_rows_refuses_more_rows_than_the_batch() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        pad_rows(np.zeros((65, 1)), 64)


def test_unpad_keeps_only_real_rows_in_order() -> None:
    outputs = pad_batch({"Y": np.arange(5).reshape(5, 1)}, 64)
    assert unpad(outputs, 5)["Y"][:, 0].tolist() == [0, 1, 2, 3, 4]


def test_bytes_round_trip_through_the_wire() -> None:
    rows = [encode_input(TEXT, text) for text in ["", "héllo", "🙂"]]
    stacked = stack_rows(TEXT, rows)
    assert stacked.shape == (3, 1)
    assert stacked[:, 0].tolist() == [b"", "héllo".encode(), "🙂".encode()]


def test_numeric_rows_round_trip_through_the_wire() -> None:
    rows = [encode_input(VECTOR, [1, 2.5, -3]), encode_input(VECTOR, [0, 0, 1e10])]
    stacked = stack_rows(VECTOR, rows)
    assert stacked.dtype == np.float32 and stacked.shape == (2, 3)
    assert stacked[0].tolist() == [1.0, 2.5, -3.0]


@pytest.mark.parametrize(
    ("spec", "value", "message"),
    [
        (TEXT, 5, "must be a string (BYTES), got an integer"),
        (TEXT, None, "got null"),
        (VECTOR, [1, 2], "must hold 3 elements"),
        (VECTOR, [1, "2", 3], "V[1] must be a number"),
        (VECTOR, [1, float("inf"), 3], "finite"),
        (COUNT, 300, "out of range for INT8"),
        (COUNT, True, "must be an integer"),
        (COUNT, 1.5, "must be an integer"),
    ],
)
def test_invalid_values_are_refused_with_a_message_naming_the_problem(
    spec: TensorSpec, value: object, message: str
) -> None:
    with pytest.raises(
        InputValidationError,
        match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)"),
    ):
        encode_input(spec, value)


def test_output_rows_become_json() -> None:
    assert output_rows_to_json(TEXT, np.array([[b"abc"], [b"\xff"], [b""]], dtype=object)) == [
        "abc",
        {"base64": "/w=="},
        "",
    ]
    assert output_rows_to_json(TEXT, np.array([[b"abc"], [b"de"]], dtype="S3")) == ["abc", "de"]
    counts = output_rows_to_json(COUNT, np.array([[7], [-3]], dtype=np.int8))
    assert counts == [7, -3] and all(type(count) is int for count in counts)
    assert output_rows_to_json(VECTOR, np.array([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]], dtype=np.float32)) == [
        [1.0, 2.0, 3.0],
        [0.5, 0.0, -1.0],
    ]
    assert output_rows_to_json(TensorSpec("W", "BYTES", (2,)), np.array([[b"a", b"\xff"]], dtype=object)) == [
        ["a", {"base64": "/w=="}]
    ]
    assert output_rows_to_json(COUNT, np.zeros((0, 1), dtype=np.int8)) == []


def test_signature_from_triton_metadata_drops_the_batch_dimension() -> None:
    metadata = {
        "name": "m",
        "versions": ["1"],
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": ["64", "1"]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": ["-1", "8"]}],
    }
    signature = ModelSignature.from_triton_metadata(metadata, batch_size=64)
    assert signature.inputs == (TensorSpec("TEXT", "BYTES", (1,)),)
    assert signature.outputs == (TensorSpec("Y", "FP32", (8,)),)


@pytest.mark.parametrize(
    ("inputs", "rows"),
    [
        ([{"name": "X", "shape": ["16", "1"]}], 16),  # the batch spelled out: a fixed-batch API
        ([{"name": "X", "shape": ["-1", "1"]}, {"name": "Y", "shape": ["-1"]}], None),  # max_batch_size says
        ([{"name": "X", "shape": ["-1", "1"]}, {"name": "Y", "shape": ["64", "2"]}], 64),
    ],
)
def test_a_models_rows_a_call_are_read_from_its_fixed_first_dimension(inputs: list[dict], rows: int | None) -> None:
    assert fixed_batch_size({"name": "m", "inputs": inputs}) == rows


@pytest.mark.parametrize(
    ("shape", "message"),
    [(["32", "1"], "first dimension"), (["64", "-1"], "variable row shape")],
)
def test_signatures_brimful_cannot_batch_are_refused_at_start(shape: list[str], message: str) -> None:
    metadata = {"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": shape}], "outputs": []}
    with pytest.raises(UnsupportedModelError, match=message):
        ModelSignature.from_triton_metadata(metadata, batch_size=64)


@pytest.mark.parametrize("value", [1e39, -3.5e38, 10**40, 10**400])
def test_a_number_beyond_fp32_is_refused_not_made_infinite(value: float) -> None:
    with pytest.raises(InputValidationError, match="X"):
        encode_input(TensorSpec("X", "FP32", (1,)), value)


def test_numbers_within_range_keep_their_value() -> None:
    tensor = encode_input(TensorSpec("X", "FP32", (2,)), [3.0e38, -1])
    assert np.frombuffer(tensor.raw_contents, dtype="<f4").tolist() == [pytest.approx(3.0e38), -1.0]


def test_rows_with_nan_or_infinite_outputs_are_found() -> None:
    specs = [TensorSpec("E", "FP32", (2,)), TensorSpec("N", "INT64", (1,)), TensorSpec("S", "FP64", (1,))]
    outputs = {
        "E": np.array([[0.0, 1.0], [np.nan, 1.0], [0.0, 0.0], [1.0, np.inf]], dtype=np.float32),
        "N": np.zeros((4, 1), dtype=np.int64),
        "S": np.array([[1.0], [2.0], [-np.inf], [np.nan]]),
    }
    assert non_finite_rows(specs, outputs) == {1: "E", 2: "S", 3: "E"}
    assert non_finite_rows(specs, {**outputs, "E": np.zeros((4, 2)), "S": np.zeros((4, 1))}) == {}


def test_a_row_that_does_not_fit_its_spec_says_why() -> None:
    text = TensorSpec("TEXT", "BYTES", (1,))
    vector = TensorSpec("V", "FP32", (3,))
    assert row_mismatch(text, encode_input(text, "hello")) is None
    assert row_mismatch(vector, encode_input(vector, [1.0, 2.0, 3.0])) is None
    assert row_mismatch(text, None) == "input TEXT is missing"
    assert "is FP32, the model takes BYTES" in str(
        row_mismatch(text, encode_input(TensorSpec("TEXT", "FP32", (1,)), 1.0))
    )
    assert "row shape [2]" in str(
        row_mismatch(text, InputTensor(datatype="BYTES", shape=[2], bytes_contents=[b"a", b"b"]))
    )
    assert "holds 2 elements" in str(
        row_mismatch(text, InputTensor(datatype="BYTES", shape=[1], bytes_contents=[b"a", b"b"]))
    )
    assert "holds 8 bytes" in str(row_mismatch(vector, InputTensor(datatype="FP32", shape=[3], raw_contents=b"\0" * 8)))

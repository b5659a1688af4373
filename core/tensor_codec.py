"""Conversions between JSON values, wire tensors (``InputTensor``) and numpy batches.

The API encodes each JSON input into an ``InputTensor`` after checking it against the
model's signature; the worker stacks the rows of a batch back into numpy arrays and
turns each output row into JSON. Both directions live here so they cannot drift apart.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from brimful.core.model_catalogue import TensorSpec
from brimful.schemas import InputTensor

_JSON_KIND = {"BYTES": "a string", "BOOL": "a boolean"}


class InputValidationError(ValueError):
    """An input value that does not fit the model; the message names what is wrong."""


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _expected_kind(spec: TensorSpec) -> str:
    if spec.datatype in _JSON_KIND:
        return _JSON_KIND[spec.datatype]
    if spec.datatype.startswith(("INT", "UINT")):
        return "an integer"
    return "a number"


def _check_element(spec: TensorSpec, value: Any, where: str) -> Any:
    """Return the element converted for numpy, or raise naming the problem."""
    expected = _expected_kind(spec)
    fail = InputValidationError(f"input {where} must be {expected} ({spec.datatype}), got {_kind_of(value)}")
    if spec.datatype == "BYTES":
        if not isinstance(value, str):
            raise fail
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON allows lone surrogates ("\ud800"); UTF-8 does not
            raise InputValidationError(f"input {where} is not valid Unicode text: {error.reason}") from error
    if spec.datatype == "BOOL":
        if not isinstance(value, bool):
            raise fail
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail
    if spec.datatype.startswith(("INT", "UINT")):
        if not isinstance(value, int):
            raise fail
        info = np.iinfo(spec.numpy_dtype)
        if not info.min <= value <= info.max:
            raise InputValidationError(
                f"input {where} = {value} is out of range for {spec.datatype} ({info.min}..{info.max})"
            )
        return value
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputValidationError(f"input {where} must be a finite number")
    largest = float(np.finfo(spec.numpy_dtype).max)
    if abs(number) > largest:
        raise InputValidationError(f"input {where} = {number:g} is out of range for {spec.datatype} (±{largest:g})")
    return value


def _flatten(spec: TensorSpec, value: Any, shape: Sequence[int], where: str, out: list[Any]) -> None:
    if not shape:
        out.append(_check_element(spec, value, where))
        return
    if not isinstance(value, list):
        raise InputValidationError(
            f"input {where} must be a list of {shape[0]} (row shape {list(spec.row_shape)}), got {_kind_of(value)}"
        )
    if len(value) != shape[0]:
        plural = "element" if shape[0] == 1 else "elements"
        raise InputValidationError(
            f"input {where} must hold {shape[0]} {plural} (row shape {list(spec.row_shape)}), "
            f"got a list of {len(value)}"
        )
    for index, item in enumerate(value):
        _flatten(spec, item, shape[1:], f"{where}[{index}]", out)


def encode_input(spec: TensorSpec, value: Any) -> InputTensor:
    """Check one JSON input value against its spec and encode it as a wire tensor.

    A row of shape ``[1]`` may be given as a bare scalar (``"hello"`` for ``["hello"]``).
    """
    shape = spec.row_shape
    if shape == (1,) and not isinstance(value, list):
        value = [value]
    elements: list[Any] = []
    _flatten(spec, value, shape, spec.name, elements)
    tensor = InputTensor(datatype=spec.datatype, shape=list(shape))
    if spec.datatype == "BYTES":
        tensor.bytes_contents.extend(elements)
    else:
        tensor.raw_contents = np.asarray(elements, dtype=spec.numpy_dtype).tobytes()
    return tensor


def row_mismatch(spec: TensorSpec, row: InputTensor | None) -> str | None:
    """Why one task's input does not fit ``spec`` (the model it will be called with), or
    None when it does: a task checked against another version of the model (a replayed
    dead letter, a model changed under a backlog) must fail alone, before it is stacked
    with its neighbours into one tensor."""
    if row is None:
        return f"input {spec.name} is missing"
    if row.datatype != spec.datatype:
        return f"input {spec.name} is {row.datatype}, the model takes {spec.datatype}"
    if tuple(row.shape) != spec.row_shape:
        return f"input {spec.name} has row shape {list(row.shape)}, the model takes {list(spec.row_shape)}"
    count = math.prod(spec.row_shape)
    if spec.datatype == "BYTES":
        if len(row.bytes_contents) != count:
            return f"input {spec.name} holds {len(row.bytes_contents)} elements, its shape {count}"
    elif len(row.raw_contents) != count * spec.numpy_dtype.itemsize:
        return f"input {spec.name} holds {len(row.raw_contents)} bytes, its shape {count * spec.numpy_dtype.itemsize}"
    return None


def stack_rows(spec: TensorSpec, rows: Sequence[InputTensor]) -> NDArray[Any]:
    """Stack the rows of one input into a ``(len(rows), *row_shape)`` array."""
    shape = (len(rows), *spec.row_shape)
    if spec.datatype == "BYTES":
        flat: list[bytes] = []
        for row in rows:
            flat.extend(row.bytes_contents)
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    return np.frombuffer(b"".join(row.raw_contents for row in rows), dtype=spec.numpy_dtype).reshape(shape)


def _json_element(value: Any) -> Any:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.generic):
        return value.item()
    return value


def output_rows_to_json(spec: TensorSpec, array: NDArray[Any]) -> list[Any]:
    """Each row of an output as JSON, in order; a row of shape ``[1]`` becomes a bare
    scalar. Numbers convert in one ``tolist`` for the whole output, not a row at a time."""
    if len(array) == 0:
        return []
    if spec.row_shape in ((1,), ()):
        first = array.reshape(len(array), -1)[:, 0]  # a row's first element
        if first.dtype == object or first.dtype.kind in "SU":
            return [_json_element(value) for value in first]
        rows: list[Any] = first.tolist()
    elif array.dtype == object:
        rows = np.vectorize(_json_element, otypes=[object])(array).tolist()
    else:
        rows = array.tolist()
    return rows


def non_finite_rows(specs: Sequence[TensorSpec], outputs: Mapping[str, NDArray[Any]]) -> dict[int, str]:
    """Rows whose floating-point outputs hold NaN or infinity (JSON cannot carry them),
    each with the name of the first such output."""
    unfit: dict[int, str] = {}
    for spec in specs:
        array = outputs[spec.name]
        if array.dtype.kind != "f":
            continue
        finite = np.isfinite(array).reshape(array.shape[0], -1).all(axis=1)
        for row in np.flatnonzero(~finite):
            unfit.setdefault(int(row), spec.name)
    return unfit

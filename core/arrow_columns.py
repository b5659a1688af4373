"""Tasks from an Arrow table: each column one of the model's inputs, each row one task's
input tensors, converted a column at a time.

A ``BYTES`` input of row shape ``[1]`` is a string or binary column; a numeric input is a
column of its type (row shape ``[1]``) or a fixed-size list of it (a vector a row, of the
row's element count). Numbers are converted to the model's type in one numpy step for the
whole column and each row's bytes are a slice of it, so no Python code runs per element
(the JSON path checks each element in Python). A null, a list of another length or a
type that does not fit is refused naming the column and the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from brimful.core.model_catalogue import InputValidationError, TensorSpec
from brimful.schemas import InputTensor

# Arrow type ids a numeric input's column may hold, by the kind of the model's type.
_KINDS = {"f": ("f", "i", "u"), "i": ("i", "u"), "u": ("u",), "b": ("b",)}


def tensors_from_table(specs: Sequence[TensorSpec], table: pa.Table) -> list[dict[str, InputTensor]]:
    """Each row's input tensors; InputValidationError naming the column and row that do not fit."""
    names = [spec.name for spec in specs]
    unknown = sorted(set(table.column_names) - set(names))
    missing = [name for name in names if name not in table.column_names]
    if unknown or missing:
        raise InputValidationError(
            f"the table's columns must be the model's inputs ({', '.join(names)}); "
            + (f"unknown: {', '.join(unknown)}" if unknown else f"missing: {', '.join(missing)}")
        )
    rows: list[dict[str, InputTensor]] = [{} for _ in range(table.num_rows)]
    for spec in specs:
        column = table.column(spec.name).combine_chunks()
        if column.null_count:
            raise InputValidationError(f"column {spec.name} has a null in row {_first_null(column)}")
        encoded = _bytes_rows(spec, column) if spec.datatype == "BYTES" else _numeric_rows(spec, column)
        for row, tensor in zip(rows, encoded):
            row[spec.name] = tensor
    return rows


def _bytes_rows(spec: TensorSpec, column: pa.Array) -> list[InputTensor]:
    if spec.row_shape != (1,):
        raise InputValidationError(f"input {spec.name} has row shape {list(spec.row_shape)}: send it as JSON")
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type)
            or pa.types.is_large_binary(column.type)):  # fmt: skip
        raise InputValidationError(f"column {spec.name} must be string or binary (BYTES), not {column.type}")
    values = column.cast(pa.binary()) if not pa.types.is_binary(column.type) else column
    return [InputTensor(datatype="BYTES", shape=[1], bytes_contents=[value]) for value in values.to_pylist()]


def _numeric_rows(spec: TensorSpec, column: pa.Array) -> list[InputTensor]:
    width = int(np.prod(spec.row_shape))
    if pa.types.is_fixed_size_list(column.type):
        if column.type.list_size != width:
            raise InputValidationError(
                f"column {spec.name} holds lists of {column.type.list_size}; the model takes {width} a row"
            )
        if column.values.null_count:
            raise InputValidationError(f"column {spec.name} has a null inside a row")
        values = column.values.to_numpy(zero_copy_only=False)
    elif width == 1:
        values = column.to_numpy(zero_copy_only=False)
    else:
        raise InputValidationError(
            f"column {spec.name} must be a fixed-size list of {width} (row shape {list(spec.row_shape)}), "
            f"not {column.type}"
        )
    target = spec.numpy_dtype
    if values.dtype.kind not in _KINDS.get(target.kind, ()):
        raise InputValidationError(f"column {spec.name} holds {values.dtype}; the model takes {spec.datatype}")
    with np.errstate(over="ignore", invalid="ignore"):
        converted = values.astype(target)
    if target.kind == "f" and not np.isfinite(converted).all():
        raise InputValidationError(f"column {spec.name} holds a number that is not finite in {spec.datatype}")
    if target.kind in "iu" and not np.array_equal(converted, values):
        raise InputValidationError(f"column {spec.name} holds a number out of range for {spec.datatype}")
    raw = converted.tobytes()
    size = width * target.itemsize
    shape = list(spec.row_shape)
    return [
        InputTensor(datatype=spec.datatype, shape=shape, raw_contents=raw[start : start + size])
        for start in range(0, len(raw), size)
    ]


def _first_null(column: pa.Array) -> int:
    return int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])

"""Pad a partial batch to the model's fixed size, and drop the padding from outputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray


def pad_rows(array: NDArray[Any], batch_size: int) -> NDArray[Any]:
    """Append filler rows (zeros; empty strings for BYTES) up to ``batch_size`` rows."""
    rows = array.shape[0]
    if rows > batch_size:
        raise ValueError(f"{rows} rows do not fit a batch of {batch_size}")
    if rows == batch_size:
        return array
    filler_shape = (batch_size - rows, *array.shape[1:])
    if array.dtype == object:
        filler = np.full(filler_shape, b"", dtype=object)
    else:
        filler = np.zeros(filler_shape, dtype=array.dtype)
    return np.concatenate([array, filler])


def pad_batch(inputs: Mapping[str, NDArray[Any]], batch_size: int) -> dict[str, NDArray[Any]]:
    """Pad every input of a batch to exactly ``batch_size`` rows."""
    return {name: pad_rows(array, batch_size) for name, array in inputs.items()}


def unpad(outputs: Mapping[str, NDArray[Any]], real_rows: int) -> dict[str, NDArray[Any]]:
    """Keep only the rows that belong to real tasks (the first ``real_rows``)."""
    return {name: array[:real_rows] for name, array in outputs.items()}

"""The reference model: trivial on purpose, so every result proves it belongs to its own input.

Input ``TEXT`` (one UTF-8 string per row); outputs ``SHA256`` (lowercase hex digest of
the row's bytes) and ``LENGTH`` (its byte length, int64). It is served with a fixed
shape of exactly ``batch_size`` rows, so Triton itself refuses any other call.

Fault hook: a call fails with a model error when any row's TEXT starts with ``!fail``.
"""

from __future__ import annotations

import hashlib

import numpy as np

MODEL_NAME = "brimful_reference"
FAIL_PREFIX = b"!fail"


class ReferenceModelFault(RuntimeError):
    """Raised by the fault hook; Triton reports it to the caller as a model error."""


def reference_infer(text: np.ndarray) -> dict[str, np.ndarray]:
    """Compute SHA256 and LENGTH for every row of ``text`` (shape ``(rows, 1)``, bytes)."""
    rows = [bytes(value) for value in text.reshape(-1)]
    for index, row in enumerate(rows):
        if row.startswith(FAIL_PREFIX):
            raise ReferenceModelFault(f"row {index} starts with {FAIL_PREFIX.decode()!r}: fault hook triggered")
    digests = np.array([hashlib.sha256(row).hexdigest().encode() for row in rows], dtype=object)
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    return {"SHA256": digests.reshape(-1, 1), "LENGTH": lengths.reshape(-1, 1)}

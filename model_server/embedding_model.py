"""The embedded stack's embedding model: small, deterministic and free to load, so tests and
``make up`` serve ``POST /v1/embeddings`` without a 1.4 GB download (MiniLM is the real
one, behind its extra).

Input ``TEXT`` (one UTF-8 string per row); output ``EMBEDDING``: ``DIMENSIONS`` float32 of
unit length. Each lowercased word, and each three-character window of it, adds +1 or -1
to one dimension picked by its hash (the hashing trick), so texts that share words point
the same way and the same text always gets the same vector. An empty row (the padding of
a fixed batch) gets zeros. A row starting with ``!fail`` fails the call, as in the
reference model: failing rows for tests and drills.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

MODEL_NAME = "brimful_embedding"
DIMENSIONS = 32
FAIL_PREFIX = b"!fail"


class EmbeddingModelFault(RuntimeError):
    """Raised by the fault hook; Triton reports it to the caller as a model error."""


def _features(text: str) -> list[str]:
    words = text.lower().split()
    return words + [word[start : start + 3] for word in words for start in range(max(0, len(word) - 2))]


def embed(text: bytes) -> NDArray[Any]:
    """One row's vector: float32, unit length (zeros for an empty row)."""
    vector = np.zeros(DIMENSIONS, dtype=np.float64)
    for feature in _features(text.decode("utf-8", errors="replace")):
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        vector[digest[0] % DIMENSIONS] += 1.0 if digest[1] & 1 else -1.0
    norm = float(np.linalg.norm(vector))
    if norm == 0.0 and text:  # words that cancel out: still a unit vector, the same one each time
        vector[0], norm = 1.0, 1.0
    return (vector / norm if norm else vector).astype(np.float32)


def embedding_infer(text: NDArray[Any]) -> dict[str, NDArray[Any]]:
    """``EMBEDDING`` for every row of ``text`` (shape ``(rows, 1)``, bytes)."""
    rows = [bytes(value) for value in text.reshape(-1)]
    for index, row in enumerate(rows):
        if row.startswith(FAIL_PREFIX):
            raise EmbeddingModelFault(f"row {index} starts with {FAIL_PREFIX.decode()!r}: fault hook triggered")
    return {"EMBEDDING": np.stack([embed(row) for row in rows]) if rows else np.zeros((0, DIMENSIONS), np.float32)}

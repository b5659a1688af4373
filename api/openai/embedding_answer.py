"""An embeddings call's answer in OpenAI's schema, built from its tasks' records: the
same for ``POST /v1/embeddings`` and for a batch job's embeddings line."""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from brimful.api.http.bodies import ApiError
from brimful.api.openai.embedding_request import EmbeddingRequest
from brimful.core.task_record import TaskRecord, TaskStatus

log = logging.getLogger("brimful.api")


@dataclass(frozen=True)
class EmbeddingShape:
    """What an embeddings answer needs besides the tasks' records (kept with a batch job's line)."""

    model: str
    output: str  # the model's EMBEDDING output
    encoding_format: str
    prompt_tokens: int
    dimensions: int = 0  # a shortened vector's length (0: the model's own)

    @classmethod
    def of(cls, ask: EmbeddingRequest) -> EmbeddingShape:
        return cls(ask.model.name, ask.output.name, ask.encoding_format, ask.prompt_tokens, ask.dimensions)


def shortened(vector: list[float], dimensions: int) -> list[float]:
    """The vector's first ``dimensions`` scaled back to unit length, as a Matryoshka model's
    vectors are shortened (0, or its own length: the vector as it is)."""
    if not dimensions or dimensions >= len(vector):
        return vector
    head = np.asarray(vector[:dimensions], dtype=np.float64)
    norm = float(np.linalg.norm(head))
    return [float(x) for x in (head / norm if norm > 0 else head)]


def embeddings_answer(
    ask: EmbeddingShape, task_ids: Sequence[str], records: Sequence[TaskRecord | None]
) -> dict[str, Any]:
    """OpenAI's list of embeddings, or the error of the first input that did not end done."""
    unfinished = sum(1 for record in records if record is None or not record.status.is_final)
    if unfinished:
        raise ApiError(
            504,
            "timeout",
            f"{unfinished} of {len(records)} inputs were not embedded in time; they keep running, "
            "and the same call again is answered from their results",
        )
    data = []
    for index, (task_id, record) in enumerate(zip(task_ids, records)):
        assert record is not None
        if record.status is not TaskStatus.DONE or not record.outputs:
            reason = (record.error or {}).get("message", record.status.value)
            log.warning("embedding input failed", extra={"task_id": task_id, "status": record.status.value})
            raise ApiError(
                502, "inference_failed", f"input[{index}] was not embedded ({record.status.value}): {reason}"
            )
        vector = shortened(record.outputs[ask.output], ask.dimensions)
        embedding: Any = (
            base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
            if ask.encoding_format == "base64"
            else vector
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = ask.prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": ask.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }

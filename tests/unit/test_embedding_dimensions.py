"""``dimensions`` of ``POST /v1/embeddings``: a model declared shortenable answers any
length up to its own, cut and scaled back to unit length; any other only its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from brimful.api.http.bodies import ApiError
from brimful.api.openai.embedding_answer import shortened
from brimful.api.openai.embedding_request import parse_embedding_request
from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec

FIXED = ModelSignature("fixed", "1", 64, (TensorSpec("TEXT", "BYTES", (1,)),), (TensorSpec("EMBEDDING", "FP32", (8,)),))
CATALOGUE = ModelCatalogue.of([FIXED, dataclasses.replace(FIXED, name="nested", shortenable=True)])


def asked(model: str, dimensions: Any) -> int:
    return parse_embedding_request({"model": model, "input": "x", "dimensions": dimensions}, CATALOGUE, 10).dimensions


def test_a_shortenable_model_takes_any_length_up_to_its_own() -> None:
    assert [asked("nested", d) for d in (1, 3, 7, 8)] == [1, 3, 7, 0]  # its own: the vector as it is
    assert asked("fixed", 8) == 0 and asked("fixed", None) == 0


@pytest.mark.parametrize(("model", "dimensions"), [("fixed", 4), ("nested", 9), ("nested", 0), ("nested", -2),
                                                  ("nested", True), ("nested", 2.0), ("nested", "4")])  # fmt: skip
def test_other_lengths_are_a_400_naming_dimensions(model: str, dimensions: Any) -> None:
    with pytest.raises(ApiError) as refused:
        asked(model, dimensions)
    assert (refused.value.status, refused.value.param) == (400, "dimensions")


def test_a_shortened_vector_is_its_head_at_unit_length() -> None:
    vector = [3.0, 4.0, 12.0, 0.5]
    assert shortened(vector, 2) == [0.6, 0.8]
    assert shortened(vector, 0) == vector and shortened(vector, 4) == vector
    assert shortened([0.0, 0.0, 1.0], 2) == [0.0, 0.0]  # a zero head stays zero, never NaN
    assert np.isclose(np.linalg.norm(shortened([0.1, -0.7, 0.2, 0.9], 3)), 1.0)

"""The catalogue of models served: which signature a task's ``model`` field selects."""

from __future__ import annotations

import pytest

from brimful.core.model_catalogue import ModelCatalogue, ModelSignature, TensorSpec, UnknownModelError


def signature(name: str, batch_size: int) -> ModelSignature:
    return ModelSignature(
        name, "1", batch_size, (TensorSpec("TEXT", "BYTES", (1,)),), (TensorSpec("EMBEDDING", "FP32", (4, 2)),)
    )


def test_no_name_selects_the_first_model_served_and_a_name_selects_its_own() -> None:
    large, small = signature("large", 64), signature("small", 16)
    catalogue = ModelCatalogue.of([large, small])
    assert catalogue.get(None) is large and catalogue.get("small") is small and catalogue.get("large") is large
    assert catalogue.default == "large" and catalogue.names == ("large", "small")


def test_an_unknown_name_is_refused_naming_every_model_served() -> None:
    catalogue = ModelCatalogue.of([signature("large", 64), signature("small", 16)])
    with pytest.raises(UnknownModelError) as refused:
        catalogue.get("Large")  # names are matched exactly
    assert refused.value.available == ("large", "small")
    assert "'Large'" in str(refused.value) and "large, small" in str(refused.value)


def test_a_catalogue_serves_each_name_once_and_at_least_one_model() -> None:
    with pytest.raises(ValueError, match="share a name"):
        ModelCatalogue.of([signature("m", 64), signature("m", 16)])
    with pytest.raises(ValueError, match="at least one"):
        ModelCatalogue.of([])


def test_the_description_gives_each_model_its_rows_a_call_and_row_shapes() -> None:
    described = ModelCatalogue.of([signature("large", 64), signature("small", 16)]).describe()
    assert [(m["name"], m["batch_size"], m["default"]) for m in described] == [
        ("large", 64, True),
        ("small", 16, False),
    ]
    assert described[1]["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}]
    assert described[1]["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [4, 2]}]

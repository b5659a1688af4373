"""Pure decisions: which rows are past their deadline, which models embed, and how an
Arrow table's columns become each row's tensors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from brimful.core.arrow_columns import tensors_from_table
from brimful.core.model_catalogue import InputValidationError, ModelSignature, TensorSpec
from brimful.workers.batch import expiry_reason, past_deadline
from tests.helpers.fake_store import text_item

NOW_MS = 1_000_000


def with_deadline(task_id: str, deadline_at_ms: int):  # type: ignore[no-untyped-def]
    item = text_item(task_id, task_id)
    item.request.deadline_at_ms = deadline_at_ms
    return item


def test_only_rows_whose_deadline_passed_are_late() -> None:
    items = [
        with_deadline("none", 0),  # no deadline: never late
        with_deadline("passed", NOW_MS - 1),
        with_deadline("now", NOW_MS),  # due this very millisecond: still in time
        with_deadline("ahead", NOW_MS + 500),
        with_deadline("long-passed", 5),
    ]
    assert [item.task_id for item in past_deadline(items, NOW_MS)] == ["passed", "long-passed"]
    assert past_deadline([], NOW_MS) == []


def test_the_reason_says_how_late_and_that_it_was_not_computed() -> None:
    reason = expiry_reason(with_deadline("late", NOW_MS - 250), NOW_MS)
    assert reason["class"] == "expired" and reason["deadline_at_ms"] == NOW_MS - 250
    assert "250 ms" in str(reason["message"]) and "not computed" in str(reason["message"])


TEXT = TensorSpec("TEXT", "BYTES", (1,))


def signature(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> ModelSignature:
    return ModelSignature("m", "1", 64, inputs, outputs)


def test_a_model_embeds_when_it_takes_one_text_and_gives_a_float_vector_named_embedding() -> None:
    vector = TensorSpec("EMBEDDING", "FP32", (32,))
    embedding = signature((TEXT,), (vector,))
    assert embedding.embedding_output == vector and embedding.kind == "embedding"
    assert signature((TEXT,), (TensorSpec("EMBEDDING", "FP16", (8,)), TensorSpec("NORM", "FP32", (1,)))).kind == (
        "embedding"
    )
    for inputs, outputs in [
        ((TEXT,), (TensorSpec("SHA256", "BYTES", (1,)),)),  # the reference model
        ((TEXT,), (TensorSpec("EMBEDDING", "INT32", (32,)),)),  # not floating point
        ((TEXT,), (TensorSpec("EMBEDDING", "FP32", (4, 8)),)),  # not one vector a row
        ((TEXT,), (TensorSpec("VECTOR", "FP32", (32,)),)),  # not declared by name
        ((TensorSpec("IMAGE", "UINT8", (8, 8)),), (vector,)),  # does not take text
        ((TEXT, TensorSpec("LANG", "BYTES", (1,))), (vector,)),  # takes more than a text
    ]:
        model = signature(inputs, outputs)
        assert model.embedding_output is None and model.kind == "tensor", (inputs, outputs)


def test_numeric_columns_become_each_rows_bytes_in_the_models_type() -> None:
    vector = TensorSpec("VECTOR", "FP32", (3,))
    count = TensorSpec("COUNT", "INT8", (1,))
    values = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    table = pa.table(
        {"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 3), "COUNT": pa.array([1, 2, 3, 4])}
    )
    rows = tensors_from_table([vector, count], table)
    assert [np.frombuffer(row["VECTOR"].raw_contents, "<f4").tolist() for row in rows] == values.astype("<f4").tolist()
    assert [np.frombuffer(row["COUNT"].raw_contents, "<i1").tolist() for row in rows] == [[1], [2], [3], [4]]
    assert rows[0]["VECTOR"].shape == [3] and rows[0]["VECTOR"].datatype == "FP32"
    for bad, says in [
        (pa.table({"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0]), 2), "COUNT": [1]}), "lists of 2"),
        (
            pa.table({"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0]), 3), "COUNT": [300]}),
            "out of range",
        ),
        (
            pa.table({"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 1e300]), 3), "COUNT": [1]}),
            "not finite",
        ),
        (pa.table({"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array(["a", "b", "c"]), 3), "COUNT": [1]}), "holds"),
        (pa.table({"VECTOR": [[1.0, 2.0, 3.0]], "COUNT": [1]}), "fixed-size list"),
        (
            pa.table({"VECTOR": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, 3.0]), 3), "COUNT": [1.5]}),
            "holds",
        ),
    ]:
        with pytest.raises(InputValidationError, match=says):
            tensors_from_table([vector, count], bad)

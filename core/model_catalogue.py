"""The models one Brimful serves, by name, and the one a task gets when it names none.

The API checks a submission's ``model`` against this catalogue and shows it at
``GET /v1/models``; each entry is the model's signature (``ModelSignature``: what the
model takes and gives) as its Triton server reports it, read from Triton's metadata at
start-up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class UnknownModelError(LookupError):
    """A task named a model this Brimful does not serve."""

    def __init__(self, name: str, available: Sequence[str]) -> None:
        self.name = name
        self.available = tuple(available)
        super().__init__(f"unknown model {name[:64]!r}; this Brimful serves: {', '.join(self.available)}")


@dataclass(frozen=True)
class ModelCatalogue:
    """Signatures by model name, in the order they are served; ``default`` answers tasks
    that name no model."""

    models: Mapping[str, ModelSignature]
    default: str

    @classmethod
    def of(cls, signatures: Sequence[ModelSignature]) -> ModelCatalogue:
        """A catalogue of these models; the first is the default."""
        if not signatures:
            raise ValueError("a catalogue serves at least one model")
        models = {signature.name: signature for signature in signatures}
        if len(models) != len(signatures):
            raise ValueError("a model is served once: two signatures share a name")
        return cls(models=models, default=signatures[0].name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.models)

    def get(self, name: str | None) -> ModelSignature:
        """The named model's signature (the default's for None); UnknownModelError if not served."""
        signature = self.models.get(self.default if name is None else name)
        if signature is None:
            raise UnknownModelError(str(name), self.names)
        return signature

    def describe(self) -> list[dict[str, Any]]:
        """What ``GET /v1/models`` answers: each model's name, kind (``embedding`` or
        ``tensor``), version, rows a call, inputs and outputs (each row's shape, the batch
        dimension taken off)."""
        return [
            {
                "name": signature.name,
                "kind": signature.kind,
                "version": signature.version,
                "batch_size": signature.batch_size,
                "inputs": [_tensor(spec) for spec in signature.inputs],
                "outputs": [_tensor(spec) for spec in signature.outputs],
                "default": signature.name == self.default,
            }
            for signature in self.models.values()
        ]


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.row_shape)}


_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}


# The output name that declares a model an embedding model (see ModelSignature.embedding_output).
EMBEDDING_OUTPUT = "EMBEDDING"
_FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})
MODEL_KINDS = ("embedding", "tensor")


class UnsupportedModelError(ValueError):
    """The model's signature is one Brimful cannot batch (said at start-up, not per request)."""


def fixed_batch_size(metadata: Mapping[str, Any]) -> int | None:
    """The rows a call of a model whose inputs fix their first dimension (Triton's
    ``max_batch_size: 0`` with the batch spelled out, as a fixed-batch API is); None when
    the first dimensions are all -1 (the model's configuration says its maximum)."""
    for entry in metadata.get("inputs", []):
        dims = [int(d) for d in entry.get("shape", [])]
        if dims and dims[0] > 0:
            return dims[0]
    return None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, Triton datatype, and the shape of one row."""

    name: str
    datatype: str
    row_shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return _NUMPY_DTYPES[self.datatype]


@dataclass(frozen=True)
class ModelSignature:
    """A model's inputs and outputs, each with the batch dimension taken off."""

    name: str
    version: str
    batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def embedding_output(self) -> TensorSpec | None:
        """The output that makes this an embedding model, or None: one named ``EMBEDDING``,
        floating point, one vector a row, of a model that takes one text a row (a single
        ``BYTES`` input of row shape ``[1]``). Such a model also serves ``POST /v1/embeddings``."""
        if len(self.inputs) != 1 or self.inputs[0].datatype != "BYTES" or self.inputs[0].row_shape != (1,):
            return None
        for spec in self.outputs:
            if spec.name == EMBEDDING_OUTPUT and spec.datatype in _FLOAT_TYPES and len(spec.row_shape) == 1:
                return spec
        return None

    @property
    def kind(self) -> str:
        """``embedding`` (see ``embedding_output``) or ``tensor``: what ``GET /v1/models`` shows."""
        return "embedding" if self.embedding_output is not None else "tensor"

    @classmethod
    def from_triton_metadata(cls, metadata: Mapping[str, Any], batch_size: int) -> ModelSignature:
        """Build from ``get_model_metadata(as_json=True)``.

        The first dimension of every tensor is the batch: either fixed at ``batch_size``
        (a model that takes exactly that many rows) or -1 (a model with max_batch_size).
        """
        name = str(metadata["name"])
        versions = metadata.get("versions") or [""]

        def specs(entries: list[Mapping[str, Any]]) -> tuple[TensorSpec, ...]:
            result = []
            for entry in entries:
                dims = [int(d) for d in entry["shape"]]
                datatype = str(entry["datatype"])
                if datatype not in _NUMPY_DTYPES:
                    raise UnsupportedModelError(f"{name}: tensor {entry['name']} has unsupported datatype {datatype}")
                if not dims or dims[0] not in (-1, batch_size):
                    raise UnsupportedModelError(
                        f"{name}: tensor {entry['name']} has shape {dims}; its first dimension must be "
                        f"the batch ({batch_size} or -1)"
                    )
                if any(d < 0 for d in dims[1:]):
                    raise UnsupportedModelError(
                        f"{name}: tensor {entry['name']} has a variable row shape {dims[1:]}; rows of a "
                        "batch must share one fixed shape"
                    )
                result.append(TensorSpec(name=str(entry["name"]), datatype=datatype, row_shape=tuple(dims[1:])))
            return tuple(result)

        return cls(
            name=name,
            version=str(versions[-1]),
            batch_size=batch_size,
            inputs=specs(metadata.get("inputs", [])),
            outputs=specs(metadata.get("outputs", [])),
        )

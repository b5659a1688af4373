"""The models one Brimful serves, by name, and the one a task gets when it names none.

The API checks a submission's ``model`` against this catalogue and shows it at
``GET /v1/models``; each entry is the model's signature as its Triton server reports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from brimful.core.model_signature import ModelSignature, TensorSpec


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

"""The models one Brimful serves, by name, and the one a task gets when it names none.

The API checks a submission's ``model`` against this catalogue and shows it at
``GET /v1/models``; each entry is the model's signature (``ModelSignature``: what the
model takes and gives) as its Triton server reports it, read from Triton's metadata at
start-up.

The tensors that fit a signature: conversions between JSON values, wire tensors
(``InputTensor``) and numpy batches. The API encodes each JSON input into an ``InputTensor`` after checking it against the
model's signature; the worker stacks the rows of a batch back into numpy arrays and
turns each output row into JSON. Both directions live here so they cannot drift apart."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from brimful.schemas import InputTensor


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
                "shortenable": signature.shortenable,
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
    # An embedding model trained so that a vector's leading dimensions keep their meaning
    # (Matryoshka): it answers a shorter ``dimensions``. Declared by the operator
    # (``BRIMFUL_SHORTENABLE_EMBEDDING_MODELS``); a model's metadata cannot say it.
    shortenable: bool = False

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


# --- from core/model_catalogue.py ---
# Conversions between JSON values, wire tensors (``InputTensor``) and numpy batches.
_JSON_KIND = {"BYTES": "a string", "BOOL": "a boolean"}


class InputValidationError(ValueError):
    """An input value that does not fit the model; the message names what is wrong."""


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _expected_kind(spec: TensorSpec) -> str:
    if spec.datatype in _JSON_KIND:
        return _JSON_KIND[spec.datatype]
    if spec.datatype.startswith(("INT", "UINT")):
        return "an integer"
    return "a number"


def _check_element(spec: TensorSpec, value: Any, where: str) -> Any:
    """Return the element converted for numpy, or raise naming the problem."""
    expected = _expected_kind(spec)
    fail = InputValidationError(f"input {where} must be {expected} ({spec.datatype}), got {_kind_of(value)}")
    if spec.datatype == "BYTES":
        if not isinstance(value, str):
            raise fail
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON allows lone surrogates ("\ud800"); UTF-8 does not
            raise InputValidationError(f"input {where} is not valid Unicode text: {error.reason}") from error
    if spec.datatype == "BOOL":
        if not isinstance(value, bool):
            raise fail
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail
    if spec.datatype.startswith(("INT", "UINT")):
        if not isinstance(value, int):
            raise fail
        info = np.iinfo(spec.numpy_dtype)
        if not info.min <= value <= info.max:
            raise InputValidationError(
                f"input {where} = {value} is out of range for {spec.datatype} ({info.min}..{info.max})"
            )
        return value
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputValidationError(f"input {where} must be a finite number")
    largest = float(np.finfo(spec.numpy_dtype).max)
    if abs(number) > largest:
        raise InputValidationError(f"input {where} = {number:g} is out of range for {spec.datatype} (±{largest:g})")
    return value


def _flatten(spec: TensorSpec, value: Any, shape: Sequence[int], where: str, out: list[Any]) -> None:
    if not shape:
        out.append(_check_element(spec, value, where))
        return
    if not isinstance(value, list):
        raise InputValidationError(
            f"input {where} must be a list of {shape[0]} (row shape {list(spec.row_shape)}), got {_kind_of(value)}"
        )
    if len(value) != shape[0]:
        plural = "element" if shape[0] == 1 else "elements"
        raise InputValidationError(
            f"input {where} must hold {shape[0]} {plural} (row shape {list(spec.row_shape)}), "
            f"got a list of {len(value)}"
        )
    for index, item in enumerate(value):
        _flatten(spec, item, shape[1:], f"{where}[{index}]", out)


def encode_input(spec: TensorSpec, value: Any) -> InputTensor:
    """Check one JSON input value against its spec and encode it as a wire tensor.

    A row of shape ``[1]`` may be given as a bare scalar (``"hello"`` for ``["hello"]``).
    """
    shape = spec.row_shape
    if shape == (1,) and not isinstance(value, list):
        value = [value]
    elements: list[Any] = []
    _flatten(spec, value, shape, spec.name, elements)
    tensor = InputTensor(datatype=spec.datatype, shape=list(shape))
    if spec.datatype == "BYTES":
        tensor.bytes_contents.extend(elements)
    else:
        tensor.raw_contents = np.asarray(elements, dtype=spec.numpy_dtype).tobytes()
    return tensor


def row_mismatch(spec: TensorSpec, row: InputTensor | None) -> str | None:
    """Why one task's input does not fit ``spec`` (the model it will be called with), or
    None when it does: a task checked against another version of the model (a replayed
    dead letter, a model changed under a backlog) must fail alone, before it is stacked
    with its neighbours into one tensor."""
    if row is None:
        return f"input {spec.name} is missing"
    if row.datatype != spec.datatype:
        return f"input {spec.name} is {row.datatype}, the model takes {spec.datatype}"
    if tuple(row.shape) != spec.row_shape:
        return f"input {spec.name} has row shape {list(row.shape)}, the model takes {list(spec.row_shape)}"
    count = math.prod(spec.row_shape)
    if spec.datatype == "BYTES":
        if len(row.bytes_contents) != count:
            return f"input {spec.name} holds {len(row.bytes_contents)} elements, its shape {count}"
    elif len(row.raw_contents) != count * spec.numpy_dtype.itemsize:
        return f"input {spec.name} holds {len(row.raw_contents)} bytes, its shape {count * spec.numpy_dtype.itemsize}"
    return None


def stack_rows(spec: TensorSpec, rows: Sequence[InputTensor]) -> NDArray[Any]:
    """Stack the rows of one input into a ``(len(rows), *row_shape)`` array."""
    shape = (len(rows), *spec.row_shape)
    if spec.datatype == "BYTES":
        flat: list[bytes] = []
        for row in rows:
            flat.extend(row.bytes_contents)
        array = np.empty(len(flat), dtype=object)
        array[:] = flat
        return array.reshape(shape)
    return np.frombuffer(b"".join(row.raw_contents for row in rows), dtype=spec.numpy_dtype).reshape(shape)


def _json_element(value: Any) -> Any:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.generic):
        return value.item()
    return value


def output_rows_to_json(spec: TensorSpec, array: NDArray[Any]) -> list[Any]:
    """Each row of an output as JSON, in order; a row of shape ``[1]`` becomes a bare
    scalar. Numbers convert in one ``tolist`` for the whole output, not a row at a time."""
    if len(array) == 0:
        return []
    if spec.row_shape in ((1,), ()):
        first = array.reshape(len(array), -1)[:, 0]  # a row's first element
        if first.dtype == object or first.dtype.kind in "SU":
            return [_json_element(value) for value in first]
        rows: list[Any] = first.tolist()
    elif array.dtype == object:
        rows = np.vectorize(_json_element, otypes=[object])(array).tolist()
    else:
        rows = array.tolist()
    return rows


def non_finite_rows(specs: Sequence[TensorSpec], outputs: Mapping[str, NDArray[Any]]) -> dict[int, str]:
    """Rows whose floating-point outputs hold NaN or infinity (JSON cannot carry them),
    each with the name of the first such output."""
    unfit: dict[int, str] = {}
    for spec in specs:
        array = outputs[spec.name]
        if array.dtype.kind != "f":
            continue
        finite = np.isfinite(array).reshape(array.shape[0], -1).all(axis=1)
        for row in np.flatnonzero(~finite):
            unfit.setdefault(int(row), spec.name)
    return unfit

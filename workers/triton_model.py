"""The model behind Triton, as the batch runner calls it: asyncio, classified errors; and
the padding of a partial batch to the model's fixed size, dropped again from its outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult
from tritonclient.utils import InferenceServerException

from brimful.core.model_catalogue import ModelSignature
from brimful.core.model_metadata import ModelMetadata
from brimful.workers.model_errors import ErrorClass, ModelCallError, summarize

_UNAVAILABLE_CODES = {"StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND", "StatusCode.CANCELLED"}
_TIMEOUT_CODES = {"StatusCode.DEADLINE_EXCEEDED"}
_REJECTED_CODES = {"StatusCode.INVALID_ARGUMENT"}


def classify(error: BaseException) -> ModelCallError:
    """Turn whatever a call raised into a ModelCallError with a class and a short message."""
    if isinstance(error, ModelCallError):
        return error
    if isinstance(error, asyncio.TimeoutError):
        return ModelCallError(ErrorClass.TIMEOUT, "model call timed out")
    if isinstance(error, InferenceServerException):
        status = str(error.status())
        message = summarize(error.message() or str(error))
        if status in _UNAVAILABLE_CODES:
            return ModelCallError(ErrorClass.UNAVAILABLE, message)
        if status in _TIMEOUT_CODES:
            return ModelCallError(ErrorClass.TIMEOUT, message)
        if status in _REJECTED_CODES:
            return ModelCallError(ErrorClass.REJECTED, message)
        return ModelCallError(ErrorClass.MODEL_ERROR, message)
    if isinstance(error, (ConnectionError, OSError)):
        return ModelCallError(ErrorClass.UNAVAILABLE, f"{type(error).__name__}: {error}")
    return ModelCallError(ErrorClass.INTERNAL, f"{type(error).__name__}: {error}")


class TritonModel(ModelMetadata):
    """One model on one Triton server, over gRPC: its metadata, and inference with every
    failure classified."""

    async def signature(self) -> ModelSignature:
        """The model's inputs and outputs; raises ModelCallError."""
        try:
            return await super().signature()
        except Exception as error:
            raise classify(error) from error

    async def infer(self, inputs: Mapping[str, NDArray[Any]], signature: ModelSignature) -> dict[str, NDArray[Any]]:
        """One call with exactly the signature's ``batch_size`` rows; raises ModelCallError."""
        wire_inputs = []
        for spec in signature.inputs:
            array = inputs[spec.name]
            if array.shape[0] != signature.batch_size:
                raise ValueError(f"input {spec.name} has {array.shape[0]} rows, the model takes {signature.batch_size}")
            wire = InferInput(spec.name, list(array.shape), spec.datatype)
            wire.set_data_from_numpy(array)
            wire_inputs.append(wire)
        outputs = [InferRequestedOutput(spec.name) for spec in signature.outputs]
        try:
            # gRPC's deadline ends the call; this bounds whatever the client does around it,
            # without the task a call that wait_for would make.
            async with asyncio.timeout(self.timeout_s + 1.0):
                result = await self._client.infer(
                    self.model_name,
                    wire_inputs,
                    model_version=self.model_version,
                    outputs=outputs,
                    client_timeout=self.timeout_s,
                )
        except Exception as error:
            raise classify(error) from error
        return {spec.name: answered(result, spec.name, signature.batch_size) for spec in signature.outputs}


def answered(result: InferResult, name: str, rows: int) -> NDArray[Any]:
    """Output ``name`` of a call's answer, with a row for each of the call's ``rows``; a
    ModelCallError when the answer lacks it or its rows (a server that garbled its answer:
    seen from a PyTriton host thawed after SIGSTOP), never an exception the batch runner
    does not expect."""
    try:
        array: NDArray[Any] | None = result.as_numpy(name)
    except ValueError as error:  # its bytes do not fill the shape it declares
        raise ModelCallError(
            ErrorClass.MODEL_ERROR, f"the model's answer is malformed: output {name}: {error}"
        ) from error
    if array is None or array.ndim == 0 or array.shape[0] != rows:
        shape = "missing" if array is None else f"of shape {list(array.shape)}"
        raise ModelCallError(
            ErrorClass.MODEL_ERROR,
            f"the model's answer is malformed: output {name} is {shape}, for a call of {rows} rows",
        )
    return array


def pad_rows(array: NDArray[Any], batch_size: int) -> NDArray[Any]:
    """Append filler rows (zeros; empty strings for BYTES) up to ``batch_size`` rows."""
    rows = array.shape[0]
    if rows > batch_size:
        raise ValueError(f"{rows} rows do not fit a batch of {batch_size}")
    if rows == batch_size:
        return array
    filler_shape = (batch_size - rows, *array.shape[1:])
    if array.dtype == object:
        filler = np.full(filler_shape, b"", dtype=object)
    else:
        filler = np.zeros(filler_shape, dtype=array.dtype)
    return np.concatenate([array, filler])


def pad_batch(inputs: Mapping[str, NDArray[Any]], batch_size: int) -> dict[str, NDArray[Any]]:
    """Pad every input of a batch to exactly ``batch_size`` rows."""
    return {name: pad_rows(array, batch_size) for name, array in inputs.items()}


def unpad(outputs: Mapping[str, NDArray[Any]], real_rows: int) -> dict[str, NDArray[Any]]:
    """Keep only the rows that belong to real tasks (the first ``real_rows``)."""
    return {name: array[:real_rows] for name, array in outputs.items()}

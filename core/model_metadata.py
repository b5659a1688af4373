"""What the model server says about one model: its signature and whether it is ready.

The API needs only this (to check submissions and to report readiness); the workers'
``TritonModel`` builds on it to run inference.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Self

import tritonclient.grpc.aio as triton_aio

from brimful.core.model_catalogue import ModelSignature, UnsupportedModelError, fixed_batch_size
from brimful.core.settings import Settings

log = logging.getLogger("brimful.model")


class ModelMetadata:
    """One model on one Triton server, over gRPC: read its metadata, ask if it is ready."""

    def __init__(self, url: str, model_name: str, model_version: str, timeout_s: float) -> None:
        self.url = url
        self.model_name = model_name
        self.model_version = model_version
        self.timeout_s = timeout_s
        self._client = triton_aio.InferenceServerClient(url)

    @classmethod
    def from_settings(cls, settings: Settings, name: str | None = None) -> Self:
        """A served model (``model_name`` when None) on the first endpoint of the pool the
        settings name. ``model_version`` is model_name's; another model gets the server's default."""
        name = settings.model_name if name is None else name
        version = settings.model_version if name == settings.model_name else ""
        return cls(settings.triton_endpoints[0], name, version, settings.infer_timeout_s)

    async def close(self) -> None:
        await self._client.close()

    async def is_ready(self) -> bool:
        """Whether the model answers as ready; never raises."""
        try:
            return bool(await self._client.is_model_ready(self.model_name, self.model_version))
        except Exception:
            return False

    async def signature(self) -> ModelSignature:
        """The model's inputs, outputs and rows a call, from Triton's metadata (and its
        configuration's ``max_batch_size`` for a model that batches on its own)."""
        metadata = await self._client.get_model_metadata(self.model_name, self.model_version, as_json=True)
        batch_size = fixed_batch_size(metadata)
        if batch_size is None:
            config = await self._client.get_model_config(self.model_name, self.model_version, as_json=True)
            batch_size = int(config.get("config", {}).get("max_batch_size", 0))
            if batch_size < 1:
                raise UnsupportedModelError(
                    f"{self.model_name}: no fixed batch dimension and no max_batch_size: Brimful cannot tell its rows a call"
                )
        return ModelSignature.from_triton_metadata(metadata, batch_size)


async def wait_for_signature(model: ModelMetadata, stop: asyncio.Event | None = None) -> ModelSignature | None:
    """Ask until the model's metadata is available (it may still be loading), backing off
    up to 2 s between tries; None if ``stop`` is set first."""
    delay = 0.2
    while stop is None or not stop.is_set():
        try:
            signature = await model.signature()
            log.info("model signature loaded", extra={"model": signature.name, "inputs": signature.input_names})
            return signature
        except Exception as error:
            log.info("waiting for the model", extra={"model": model.model_name, "error": str(error)})
        if stop is None:
            await asyncio.sleep(delay)
        else:
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
        delay = min(delay * 2, 2.0)
    return None

"""``/v1/models``: the models this Brimful serves, each with its kind, rows a call and
signature; in Brimful's shape (``models``) and in OpenAI's (``object``, ``data``), so
OpenAI's client lists and retrieves them too."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import ApiError
from brimful.api.http.guards import requires
from brimful.api.state import api_state
from brimful.api.tasks.submitter import model_not_ready
from brimful.core.api_keys import Scope
from brimful.core.model_catalogue import ModelCatalogue

router = APIRouter(tags=["models"])

MODELS_PATH = "/v1/models"


def _catalogue(request: Request) -> ModelCatalogue:
    catalogue = api_state(request).catalogue
    if catalogue is None:
        raise model_not_ready()
    return catalogue


def _as_openai(entry: dict[str, Any]) -> dict[str, Any]:
    # OpenAI's Model object; ``created`` is not known for a model read from Triton: 0.
    return {
        "id": entry["name"],
        "object": "model",
        "created": 0,
        "owned_by": "brimful",
        "kind": entry["kind"],
        "shortenable": entry["shortenable"],
    }


@router.get(MODELS_PATH, dependencies=[Depends(requires(Scope.READ))])
async def list_models(request: Request) -> dict[str, Any]:
    """Every model a task may name in ``model``; the one marked default serves tasks that
    name none. ``data`` lists the same models as OpenAI's Model objects."""
    described = _catalogue(request).describe()
    return {"object": "list", "data": [_as_openai(entry) for entry in described], "models": described}


@router.get(MODELS_PATH + "/{model}", dependencies=[Depends(requires(Scope.READ))])
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    """One model: OpenAI's Model object with Brimful's description beside it."""
    for entry in _catalogue(request).describe():
        if entry["name"] == model:
            return {**_as_openai(entry), **entry}
    raise ApiError(404, "model_not_found", f"no model {model[:64]!r} is served here (GET /v1/models lists them)")

"""``/v1/models``: the models this Brimful serves, each with its rows a call and signature."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from brimful.api.auth import requires
from brimful.api.errors import ApiError
from brimful.api.state import api_state
from brimful.core.api_keys import Scope

router = APIRouter(tags=["models"])

MODELS_PATH = "/v1/models"


@router.get(MODELS_PATH, dependencies=[Depends(requires(Scope.READ))])
async def list_models(request: Request) -> dict[str, Any]:
    """Every model a task may name in ``model``; the one marked default serves tasks that name none."""
    catalogue = api_state(request).catalogue
    if catalogue is None:
        raise ApiError(503, "model_not_ready", "the models' metadata is not loaded yet", {"Retry-After": "1"})
    return {"models": catalogue.describe()}

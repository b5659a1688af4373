"""What operators watch and tune: batching totals with every live batcher (``/v1/stats``),
and the live flush policy (``/v1/admin/policy``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from brimful.api.auth import Principal, requires
from brimful.api.errors import ApiError
from brimful.api.request_body import parse_json, read_body
from brimful.api.state import api_state
from brimful.core.api_keys import Scope
from brimful.core.policy_tuning import TuningError

router = APIRouter(tags=["batching"])

POLICY_BODY_LIMIT_BYTES = 64 * 1024


@router.get("/v1/stats", dependencies=[Depends(requires(Scope.READ))])
async def stats(request: Request) -> dict[str, Any]:
    """Totals across every batcher: batches sent to the model, real rows in them, padding."""
    state = api_state(request)
    counters = await state.stats.read()
    batches = counters["batches_dispatched"]
    answer: dict[str, Any] = dict(counters)
    answer["mean_rows_per_batch"] = round(counters["rows_dispatched"] / batches, 2) if batches else 0.0
    answer["batchers"] = await state.status_board.read_all()
    return answer


@router.get("/v1/admin/policy", dependencies=[Depends(requires(Scope.ADMIN))])
async def get_policy(request: Request) -> dict[str, Any]:
    """The flush-policy parameters every batcher uses now, their defaults, recent changes."""
    tuning = api_state(request).tuning
    return {"params": await tuning.values(), "defaults": tuning.defaults, "history": await tuning.history()}


@router.patch("/v1/admin/policy")
async def change_policy(request: Request, principal: Principal = Depends(requires(Scope.ADMIN))) -> dict[str, Any]:
    """Change flush-policy parameters of every running batcher (applied within ~1 s)."""
    document = parse_json(
        await read_body(request, POLICY_BODY_LIMIT_BYTES, api_state(request).settings.api_read_timeout_s)
    )
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", 'body must be a JSON object like {"max_wait_ms": 100}')
    try:
        return await api_state(request).tuning.update(document, actor=principal.actor(request))
    except TuningError as error:
        raise ApiError(422, "invalid_policy", str(error)) from error

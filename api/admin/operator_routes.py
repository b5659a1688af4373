"""What operators watch and tune: batching totals with every live batcher (``/v1/stats``),
and the live flush policy (``/v1/admin/policy``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import ApiError, parse_json, read_body
from brimful.api.http.guards import Principal, requires
from brimful.api.state import api_state
from brimful.core.api_keys import Scope
from brimful.core.policy_tuning import TuningError

router = APIRouter(tags=["batching"])

POLICY_BODY_LIMIT_BYTES = 64 * 1024


def _model_param(request: Request) -> str:
    """The model a ``?model=`` query names (422 ``unknown_model`` if not served; without
    it, the default model)."""
    return api_state(request).served_model(request.query_params.get("model"))


@router.get("/v1/stats", dependencies=[Depends(requires(Scope.READ))])
async def stats(request: Request) -> dict[str, Any]:
    """One model's totals across its batchers (``?model=``, default: the default model):
    batches sent to the model, real rows in them, padding; and every live batcher."""
    state = api_state(request)
    model = _model_param(request)
    counters = await state.stats_of(model).read()
    batches = counters["batches_dispatched"]
    answer: dict[str, Any] = {"model": model, **counters}
    answer["mean_rows_per_batch"] = round(counters["rows_dispatched"] / batches, 2) if batches else 0.0
    # A batcher of a release before models were named reports none: the default model's.
    answer["batchers"] = [
        status
        for status in await state.status_board.read_all()
        if status.get("model", state.settings.default_model) == model
    ]
    return answer


@router.get("/v1/admin/policy", dependencies=[Depends(requires(Scope.ADMIN))])
async def get_policy(request: Request) -> dict[str, Any]:
    """The flush-policy parameters one model's batchers use now (``?model=``, default: the
    default model), their defaults, recent changes."""
    model = _model_param(request)
    tuning = api_state(request).tuning_of(model)
    return {
        "model": model,
        "params": await tuning.values(),
        "defaults": tuning.defaults,
        "history": await tuning.history(),
    }


@router.patch("/v1/admin/policy")
async def change_policy(request: Request, principal: Principal = Depends(requires(Scope.OPERATOR))) -> dict[str, Any]:
    """Change flush-policy parameters of one model's running batchers (``?model=``,
    default: the default model; applied within ~1 s). Every tenant's tasks share the
    policy, so it takes an ``operator`` key: a tenant's ``admin`` key may only read it."""
    model = _model_param(request)
    document = parse_json(
        await read_body(request, POLICY_BODY_LIMIT_BYTES, api_state(request).settings.api_read_timeout_s)
    )
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", 'body must be a JSON object like {"max_wait_ms": 100}')
    try:
        return await api_state(request).tuning_of(model).update(document, actor=principal.actor(request))
    except TuningError as error:
        raise ApiError(422, "invalid_policy", str(error)) from error

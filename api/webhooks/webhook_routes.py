"""``/v1/webhooks``: a tenant's webhook endpoints (URL, events, a secret each) and its
deliveries, with the dead ones on-call replays. Every route needs the ``admin`` scope and
sees the caller's tenant only."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request

from brimful.api.http.bodies import NO_RETRY, ApiError, parse_json, read_body
from brimful.api.http.body_schema import BodySchema
from brimful.api.http.guards import Principal, requires
from brimful.api.http.list_pages import page_limit
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope
from brimful.core.webhook_records import (
    EVENT_TYPES,
    FULL,
    LOG_KEEP,
    MAX_ENDPOINTS,
    PAYLOADS,
    Delivery,
    Endpoint,
    new_endpoint_id,
)
from brimful.core.webhook_signing import new_secret
from brimful.core.webhook_targets import MAX_URL_LENGTH, TargetRefused, check_target, origin

router = APIRouter(tags=["webhooks"])

WEBHOOKS_PATH = "/v1/webhooks"
MAX_DESCRIPTION = 256
BODY_LIMIT_BYTES = 16 * 1024
RECOVER_BODY = BodySchema(
    {
        "type": "object",
        "required": ["since"],
        "additionalProperties": False,
        "properties": {
            "since": {"type": "integer", "minimum": 0, "maximum": 2**40, "description": "Unix seconds"},
        },
    }
)
ENDPOINT_BODY = BodySchema(
    {
        "type": "object",
        "required": ["url", "events"],
        "additionalProperties": False,
        "properties": {
            "url": {
                "type": "string",
                "format": "uri",
                "maxLength": MAX_URL_LENGTH,
                "description": "where deliveries are POSTed",
            },
            "events": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "enum": list(EVENT_TYPES)},
                "description": "the event types sent there",
            },
            "description": {"type": "string", "maxLength": MAX_DESCRIPTION},
            "payload": {
                "type": "string",
                "enum": list(PAYLOADS),
                "description": "thin: a task event carries its id, model, status and times, not its outputs",
            },
        },
    }
)
LIST_LIMIT_MAX = 1000
_admin = requires(Scope.ADMIN)


@router.post(WEBHOOKS_PATH + "/endpoints")
async def add_endpoint(request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """Register an endpoint for some event types; the answer carries its signing secret, once."""
    state = api_state(request)
    document = ENDPOINT_BODY.check(
        parse_json(await read_body(request, BODY_LIMIT_BYTES, state.settings.api_read_timeout_s))
    )
    url, events, description = document["url"], document["events"], document.get("description", "")
    try:
        await check_target(url, state.webhook_hosts)
    except TargetRefused as error:
        raise ApiError(400, "invalid_url", f"url: {error}") from error
    endpoint = Endpoint(
        new_endpoint_id(),
        principal.tenant,
        url,
        tuple(dict.fromkeys(events)),
        new_secret(),
        description,
        int(time.time()),
        payload=document.get("payload", FULL),
    )
    if not await state.webhooks.add_endpoint(endpoint):
        raise ApiError(400, "too_many_endpoints", f"a tenant has at most {MAX_ENDPOINTS} webhook endpoints")
    return endpoint.shown(with_secret=True)


@router.get(WEBHOOKS_PATH + "/endpoints")
async def list_endpoints(request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """The tenant's endpoints, oldest first (no secrets)."""
    endpoints = await api_state(request).webhooks.endpoints(principal.tenant)
    return {"object": "list", "data": [endpoint.shown() for endpoint in endpoints]}


async def _own_endpoint(state: ApiState, endpoint_id: str, principal: Principal) -> Endpoint:
    endpoint = await state.webhooks.endpoint(endpoint_id, principal.tenant)
    if endpoint is None:
        raise ApiError(404, "endpoint_not_found", f"no webhook endpoint {endpoint_id[:64]!r} for this tenant")
    return endpoint


@router.delete(WEBHOOKS_PATH + "/endpoints/{endpoint_id}")
async def delete_endpoint(endpoint_id: str, request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """Remove an endpoint; its pending deliveries end dead."""
    state = api_state(request)
    await state.webhooks.remove_endpoint(await _own_endpoint(state, endpoint_id, principal))
    return {"id": endpoint_id, "deleted": True}


@router.post(WEBHOOKS_PATH + "/endpoints/{endpoint_id}/rotate-secret")
async def rotate_secret(endpoint_id: str, request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """A new secret for the endpoint, shown this once; the old one signs beside it for
    ``webhook_secret_overlap_s``, so the receiver can move to the new one meanwhile."""
    state = api_state(request)
    endpoint = await _own_endpoint(state, endpoint_id, principal)
    rotated = await state.webhooks.rotate_secret(endpoint, state.settings.webhook_secret_overlap_s)
    return rotated.shown(with_secret=True)


@router.post(WEBHOOKS_PATH + "/endpoints/{endpoint_id}/recover")
async def recover_endpoint(
    endpoint_id: str, request: Request, principal: Principal = Depends(_admin)
) -> dict[str, Any]:
    """Send again every dead delivery of the endpoint made since ``since`` (Unix seconds),
    each with its own id, as a replay does: what a receiver lost in an outage, in one call
    (the tenant's last ``LOG_KEEP`` dead ones are those kept)."""
    state = api_state(request)
    document = RECOVER_BODY.check(
        parse_json(await read_body(request, BODY_LIMIT_BYTES, state.settings.api_read_timeout_s))
    )
    endpoint = await _own_endpoint(state, endpoint_id, principal)
    if endpoint.disabled:
        raise ApiError(
            409, "endpoint_disabled", f"endpoint {endpoint_id} is disabled: enable it first", headers=NO_RETRY
        )
    since_ms = int(document["since"]) * 1000
    dead = await state.webhooks.listed(principal.tenant, LOG_KEEP, dead=True)
    chosen = [d for d in dead if d.endpoint_id == endpoint_id and d.created_at_ms >= since_ms]
    for delivery in chosen:
        await state.webhooks.replay(delivery)
    return {"object": "list", "data": [delivery.shown() for delivery in chosen]}


@router.post(WEBHOOKS_PATH + "/endpoints/{endpoint_id}/enable")
async def enable_endpoint(endpoint_id: str, request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """Deliver to a disabled endpoint again (its dead deliveries can then be replayed)."""
    state = api_state(request)
    endpoint = await _own_endpoint(state, endpoint_id, principal)
    await state.webhooks.enable(endpoint)
    return {**endpoint.shown(), "disabled": False, "disabled_reason": None, "failing_since_ms": None}


@router.get(WEBHOOKS_PATH + "/callback-secret")
async def callback_secret(request: Request, principal: Principal = Depends(_admin)) -> dict[str, str]:
    """The secret that signs deliveries to the tenant's tasks' ``callback_url`` of the
    origin of ``?url=``: each receiver its own."""
    url = request.query_params.get("url")
    if not url:
        raise ApiError(
            400,
            "invalid_request",
            "url is required: the callback URL (or its origin) whose secret to show",
            param="url",
        )
    try:
        secret = await api_state(request).webhooks.callback_secret(principal.tenant, url)
    except TargetRefused as error:
        raise ApiError(400, "invalid_callback_url", f"url: {error}", param="url") from error
    return {"secret": secret, "origin": origin(url)}


@router.get(WEBHOOKS_PATH + "/deliveries")
async def list_deliveries(request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """The tenant's latest deliveries, newest first; ``state=dead``: the dead ones only."""
    state_filter = request.query_params.get("state")
    if state_filter not in (None, "dead"):
        raise ApiError(400, "invalid_request", "state must be dead, or left out for every delivery")
    limit = page_limit(request.query_params.get("limit"), LIST_LIMIT_MAX, 100)
    found = await api_state(request).webhooks.listed(principal.tenant, limit, dead=state_filter == "dead")
    return {"object": "list", "data": [delivery.shown() for delivery in found]}


async def _own_delivery(state: ApiState, delivery_id: str, principal: Principal) -> Delivery:
    delivery = await state.webhooks.delivery(delivery_id, principal.tenant)
    if delivery is None:
        raise ApiError(404, "delivery_not_found", f"no delivery {delivery_id[:64]!r} for this tenant")
    return delivery


@router.get(WEBHOOKS_PATH + "/deliveries/{delivery_id}")
async def get_delivery(delivery_id: str, request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """One delivery with the event it carries."""
    delivery = await _own_delivery(api_state(request), delivery_id, principal)
    return {**delivery.shown(), "payload": orjson.loads(delivery.payload)}


@router.post(WEBHOOKS_PATH + "/deliveries/{delivery_id}/replay")
async def replay_delivery(delivery_id: str, request: Request, principal: Principal = Depends(_admin)) -> dict[str, Any]:
    """Send a delivery again now (a dead one, or one delivered), with the same id."""
    state = api_state(request)
    delivery = await _own_delivery(state, delivery_id, principal)
    if delivery.state == "pending":
        raise ApiError(409, "delivery_pending", f"delivery {delivery_id} is still being tried")
    await state.webhooks.replay(delivery)
    return delivery.shown()

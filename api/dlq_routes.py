"""``/v1/admin/dlq``: what on-call needs at 3 a.m., over HTTP (``brimful dlq`` calls these)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from brimful.api.auth import Principal, requires
from brimful.api.dead_letter_admin import DeadLetterAdmin, DeadLetterFilter
from brimful.api.errors import ApiError
from brimful.api.request_body import parse_json
from brimful.core.api_keys import Scope

# An admin key works on its own tenant's entries; an operator key on every tenant's.
router = APIRouter(prefix="/v1/admin/dlq", tags=["dead letters"])
ADMIN = Depends(requires(Scope.ADMIN))

# The filters every DLQ operation takes, with their JSON schema as query parameters (the
# OpenAPI document shows these; ``parse_filter`` accepts exactly these names).
FILTER_FIELDS: dict[str, dict[str, Any]] = {
    "since_ms": {"type": "integer"},
    "until_ms": {"type": "integer"},
    "error_class": {"type": "string"},
    "model": {"type": "string"},
    "ids": {"type": "string", "description": "comma-separated entry or task ids"},
    "all": {"type": "boolean"},
}


def _admin(request: Request) -> DeadLetterAdmin:
    return request.app.state.brimful.dead_letters  # type: ignore[no-any-return]


def parse_filter(values: dict[str, Any], principal: Principal) -> DeadLetterFilter:
    """A filter from query parameters or a JSON body; 422 naming a bad field."""
    unknown = sorted(set(values) - set(FILTER_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_request", f"unknown filter(s): {', '.join(unknown)}; allowed: {', '.join(FILTER_FIELDS)}")

    def whole(name: str) -> int | None:
        value = values.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except (TypeError, ValueError) as error:
            raise ApiError(422, "invalid_request", f"{name} must be milliseconds since the epoch") from error

    ids = values.get("ids") or ()
    if isinstance(ids, str):
        ids = [part for part in ids.split(",") if part]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids):
        raise ApiError(422, "invalid_request", "ids must be a list of entry ids or task ids")
    include = values.get("all", False)
    return DeadLetterFilter(
        since_ms=whole("since_ms"),
        until_ms=whole("until_ms"),
        error_class=values.get("error_class") or None,
        model=values.get("model") or None,
        ids=tuple(ids),
        include_resolved=include in (True, "true", "1", "yes"),
        tenant=principal.tenants_seen,
    )


async def _body_filter(request: Request, principal: Principal) -> DeadLetterFilter:
    body = await request.body()
    document = parse_json(body) if body else {}
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "body must be a JSON object of filters")
    selection = parse_filter(document, principal)
    if not (selection.ids or selection.since_ms or selection.until_ms or selection.error_class or selection.model):
        raise ApiError(422, "invalid_request", "say which entries: ids, or a since_ms/until_ms/error_class/model filter")
    return selection


@router.get("")
async def list_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """Matching entries (open ones unless ``all=true``), oldest first, with counts by error class."""
    entries = await _admin(request).entries(parse_filter(dict(request.query_params), principal))
    summaries = [entry.summary() for entry in entries]
    return {
        "count": len(summaries),
        "by_error_class": dict(Counter(s["error_class"] for s in summaries).most_common()),
        "entries": summaries,
    }


@router.get("/export")
async def export_dead_letters(request: Request, principal: Principal = ADMIN) -> Response:
    """Matching entries as a Parquet file."""
    admin = _admin(request)
    data = admin.export(await admin.entries(parse_filter(dict(request.query_params), principal)))
    return Response(data, media_type="application/vnd.apache.parquet")


@router.get("/{entry}")
async def show_dead_letter(entry: str, request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """One entry in full, by entry id (``partition-offset``) or task id."""
    selection = DeadLetterFilter(ids=(entry,), include_resolved=True, tenant=principal.tenants_seen)
    found = await _admin(request).entries(selection)
    if not found:
        raise ApiError(404, "dead_letter_not_found", f"no dead letter {entry[:64]!r}")
    return found[-1].details()


@router.post("/replay")
async def replay_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """Send matching open entries back to the requests topic under their task ids."""
    selection = await _body_filter(request, principal)
    replayed, skipped = await _admin(request).replay(selection, principal.actor(request))
    return {"replayed": len(replayed), "task_ids": replayed, "skipped": skipped}


@router.post("/purge")
async def purge_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """Mark matching open entries purged (kept in the topic until its retention ends)."""
    purged = await _admin(request).purge(await _body_filter(request, principal), principal.actor(request))
    return {"purged": len(purged), "ids": purged}

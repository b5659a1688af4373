"""``/v1/admin/dlq``: what on-call needs at 3 a.m., over HTTP (``brimful dlq`` calls these)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from brimful.api.admin.dead_letter_admin import PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX, DeadLetterAdmin
from brimful.api.admin.dead_letter_entries import DeadLetterFilter, parse_cursor
from brimful.api.http.bodies import ApiError, admit, parse_json, read_body
from brimful.api.http.guards import Principal, requires
from brimful.api.state import api_state
from brimful.core.api_keys import Scope
from brimful.core.number_text import whole_number

# An admin key works on its own tenant's entries; an operator key on every tenant's.
router = APIRouter(prefix="/v1/admin/dlq", tags=["dead letters"])
ADMIN = Depends(requires(Scope.ADMIN))
EPOCH_MS_MAX = 2**53  # past any date a letter can carry, and exact as a JSON number

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
# Where a page starts and how much it takes: list, replay and purge work a page at a time.
PAGE_FIELDS: dict[str, dict[str, Any]] = {
    "after": {
        "type": "string",
        "maxLength": 40,
        "pattern": "^[0-9]+-[0-9]+$",
        "description": "the entry id the page starts at: the `next` of the page before",
    },
    "limit": {"type": "integer", "minimum": 0, "maximum": PAGE_LIMIT_MAX, "default": PAGE_LIMIT_DEFAULT},
}
DRY_RUN_FIELD: dict[str, dict[str, Any]] = {
    "dry_run": {"type": "boolean", "description": "say what would be replayed; change nothing"},
}


def _true(value: Any) -> bool:
    return value in (True, "true", "1", "yes")


def parse_page(values: dict[str, Any]) -> tuple[str | None, int]:
    """(cursor, limit) from query parameters or a JSON body; 422 naming a bad field.
    Removes the page fields from ``values``, leaving the filters."""
    after = values.pop("after", None) or None
    raw_limit = values.pop("limit", PAGE_LIMIT_DEFAULT)
    if after is not None:
        try:
            parse_cursor(str(after))
        except ValueError as error:
            raise ApiError(422, "invalid_request", f"after: {error}") from error
    limit = whole_number(raw_limit, 0, PAGE_LIMIT_MAX)
    if limit is None:
        raise ApiError(422, "invalid_request", f"limit must be a whole number from 0 to {PAGE_LIMIT_MAX}")
    return (str(after) if after else None), limit


def _admin(request: Request) -> DeadLetterAdmin:
    admin: DeadLetterAdmin = request.app.state.brimful.dead_letters
    return admin


async def _limited(request: Request, principal: Principal) -> DeadLetterAdmin:
    """The DLQ's operations, once the caller's tenant has a token for the call (429 with
    Retry-After past ``dlq_rate_limit_per_s``): each may read the topic."""
    await admit(api_state(request).dlq_limiter, principal.tenant)
    return _admin(request)


def parse_filter(values: dict[str, Any], principal: Principal) -> DeadLetterFilter:
    """A filter from query parameters or a JSON body; 422 naming a bad field."""
    unknown = sorted(set(values) - set(FILTER_FIELDS))
    if unknown:
        raise ApiError(
            422, "invalid_request", f"unknown filter(s): {', '.join(unknown)}; allowed: {', '.join(FILTER_FIELDS)}"
        )

    def whole(name: str) -> int | None:
        value = values.get(name)
        if value is None or value == "":
            return None
        millis = whole_number(value, 0, EPOCH_MS_MAX)
        if millis is None:
            raise ApiError(422, "invalid_request", f"{name} must be milliseconds since the epoch")
        return millis

    ids = values.get("ids") or ()
    if isinstance(ids, str):
        ids = [part for part in ids.split(",") if part]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) for i in ids):
        raise ApiError(422, "invalid_request", "ids must be a list of entry ids or task ids")
    include = values.get("all", False)
    if not isinstance(values.get("error_class") or "", str) or not isinstance(values.get("model") or "", str):
        raise ApiError(422, "invalid_request", "error_class and model must be strings")
    return DeadLetterFilter(
        since_ms=whole("since_ms"),
        until_ms=whole("until_ms"),
        error_class=values.get("error_class") or None,
        model=values.get("model") or None,
        ids=tuple(ids),
        include_resolved=_true(include),
        tenant=principal.tenants_seen,
    )


async def _body_job(
    request: Request, principal: Principal, dry_run: bool = False
) -> tuple[DeadLetterFilter, str | None, int, bool]:
    """(filter, cursor, limit, dry run) from a replay or purge body."""
    settings = api_state(request).settings
    body = await read_body(request, settings.max_body_bytes, settings.api_read_timeout_s)
    document = parse_json(body) if body else {}
    if not isinstance(document, dict):
        raise ApiError(422, "invalid_request", "body must be a JSON object of filters")
    after, limit = parse_page(document)
    dry = _true(document.pop("dry_run", False)) if dry_run else False
    selection = parse_filter(document, principal)
    if not (selection.ids or selection.since_ms or selection.until_ms or selection.error_class or selection.model):
        raise ApiError(
            422, "invalid_request", "say which entries: ids, or a since_ms/until_ms/error_class/model filter"
        )
    return selection, after, limit, dry


@router.get("")
async def list_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """A page of matching entries (open ones unless ``all=true``) in topic order, and where
    the next page starts; the first page (no ``after``) also counts every match by error class."""
    values = dict(request.query_params)
    after, limit = parse_page(values)
    selection = parse_filter(values, principal)
    admin = await _limited(request, principal)
    page = await admin.page(selection, after, limit)
    listing: dict[str, Any] = {"entries": [entry.summary() for entry in page.entries], "next": page.next_cursor}
    if after is None and not selection.ids:
        counts, complete = await admin.count(selection)
        listing.update(count=sum(counts.values()), by_error_class=dict(counts.most_common()), count_complete=complete)
    elif after is None:  # entries named by id: the page is all of them
        counts = Counter(entry.letter.error_class for entry in page.entries)
        listing.update(
            count=len(page.entries), by_error_class=dict(counts.most_common()), count_complete=page.next_cursor is None
        )
    return listing


@router.get("/export")
async def export_dead_letters(request: Request, principal: Principal = ADMIN) -> StreamingResponse:
    """Every matching entry as a Parquet file, streamed a row group at a time."""
    selection = parse_filter(dict(request.query_params), principal)
    admin = await _limited(request, principal)
    return StreamingResponse(admin.export(selection), media_type="application/vnd.apache.parquet")


@router.get("/{entry}")
async def show_dead_letter(entry: str, request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """One entry in full, by entry id (``partition-offset``) or task id."""
    found = await (await _limited(request, principal)).find(entry, principal.tenants_seen)
    if found is None:
        raise ApiError(404, "dead_letter_not_found", f"no dead letter {entry[:64]!r}")
    return found.details()


@router.post("/replay")
async def replay_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """Send a page of matching open entries back to the requests topic under their task ids."""
    selection, after, limit, dry_run = await _body_job(request, principal, dry_run=True)
    admin = await _limited(request, principal)
    page, replayed, skipped = await admin.replay(selection, principal.actor(request), after, limit, dry_run)
    return {
        "replayed": len(replayed),
        "task_ids": replayed,
        "skipped": skipped,
        "dry_run": dry_run,
        "next": page.next_cursor,
        "read": page.read,
    }


@router.post("/purge")
async def purge_dead_letters(request: Request, principal: Principal = ADMIN) -> dict[str, Any]:
    """Mark a page of matching open entries purged (kept in the topic until its retention ends)."""
    selection, after, limit, _ = await _body_job(request, principal)
    admin = await _limited(request, principal)
    page = await admin.purge(selection, principal.actor(request), after, limit)
    return {
        "purged": len(page.entries),
        "ids": [entry.entry_id for entry in page.entries],
        "next": page.next_cursor,
        "read": page.read,
    }

"""A list route's pages as OpenAI's API pages them (files, batch jobs, webhook endpoints):
the ``limit`` query parameter read, and the page answered."""

from __future__ import annotations

from typing import Any

from brimful.api.http.bodies import ApiError
from brimful.core.number_text import whole_number


def page_limit(raw: str | None, most: int, default: int) -> int:
    """A list's ``limit`` query parameter: 1 to ``most``."""
    if raw is None:
        return default
    limit = whole_number(raw, 1, most)
    if limit is None:
        raise ApiError(400, "invalid_request", f"limit must be a whole number from 1 to {most}")
    return limit


def page_answer(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list page."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }

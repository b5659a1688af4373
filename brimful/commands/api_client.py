"""How the operator commands reach a running API: base URL and error reporting."""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from brimful.core.settings import get_settings


class CommandError(RuntimeError):
    """A failure to report to the operator in one line (exit status 1)."""


def add_api_argument(parser: argparse.ArgumentParser) -> None:
    settings = get_settings()
    parser.add_argument(
        "--api",
        default=f"http://{settings.api_host}:{settings.api_port}",
        help="base URL of a Brimful API (default: from BRIMFUL_API_HOST/PORT)",
    )
    parser.add_argument(
        "--api-key", default=settings.api_key, help="API key with the scope needed (default: BRIMFUL_API_KEY)"
    )


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def call(method: str, url: str, api_key: str = "", timeout_s: float = 10.0, **kwargs: Any) -> Any:
    """One JSON call; CommandError with the server's own message on a 4xx/5xx."""
    headers = {**auth_headers(api_key), **kwargs.pop("headers", {})}
    try:
        response = httpx.request(method, url, timeout=timeout_s, headers=headers, **kwargs)
    except httpx.HTTPError as error:
        raise CommandError(f"cannot reach {url}: {error}") from error
    body = response.json() if response.content else None
    if response.status_code >= 400:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else response.text
        raise CommandError(f"{response.status_code}: {message}")
    return body

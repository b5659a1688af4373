"""Start the API: ``python -m api`` (settings from BRIMFUL_* env vars)."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from brimful.logs import configure_logging
from brimful.settings import get_settings


def main() -> None:
    settings = get_settings()
    configure_logging()
    # Several workers need an app each made in its own process: uvicorn imports the
    # factory there. One worker runs in this process.
    app = "api.app:app_from_environment" if settings.api_workers > 1 else create_app(settings)
    uvicorn.run(
        app,
        factory=settings.api_workers > 1,
        workers=settings.api_workers if settings.api_workers > 1 else None,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep our JSON logging
        access_log=False,
        timeout_graceful_shutdown=10,
    )

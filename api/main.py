"""Start the API: ``python -m api`` (settings from BRIMFUL_* env vars)."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from brimful.logs import configure_logging
from brimful.settings import get_settings


def main() -> None:
    settings = get_settings()
    configure_logging()
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep our JSON logging
        access_log=False,
        timeout_graceful_shutdown=10,
    )

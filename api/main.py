"""Start the API: ``python -m brimful.api`` (settings from BRIMFUL_* env vars)."""

from __future__ import annotations

import os
import shutil
import tempfile

import uvicorn

from brimful.api.app import create_app
from brimful.core.logs import configure_logging
from brimful.core.metrics import MULTIPROCESS_DIR_ENV
from brimful.core.settings import get_settings


def main() -> None:
    settings = get_settings()
    configure_logging()
    if settings.api_workers == 1:
        serve(create_app(settings), workers=None)
        return
    # Several workers: uvicorn imports the app factory in each worker process, and the
    # workers share their metrics through a directory, so /metrics counts for all.
    metrics_dir = tempfile.mkdtemp(prefix="brimful-api-metrics-")
    os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir
    try:
        serve("brimful.api.app:app_from_environment", workers=settings.api_workers)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


# How long the API keeps an idle connection open (uvicorn's default, named so clients can
# keep theirs shorter: a client that reuses a connection as the server closes it reads
# "server disconnected").
KEEP_ALIVE_S = 5


def serve(app: object, workers: int | None) -> None:
    settings = get_settings()
    uvicorn.run(
        app,  # type: ignore[arg-type]
        factory=workers is not None,
        workers=workers,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep our JSON logging
        access_log=False,
        # Brimful never reads the client's address; rewriting it from X-Forwarded-* would
        # cost every request.
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=KEEP_ALIVE_S,
        # Bounds on what clients hold: a deadline for a request's head (uvicorn has none),
        # and a cap on open connections (api_max_connections), both in the protocol, which
        # answers them in JSON (uvicorn's limit_concurrency answers in plain text).
        http="brimful.api.http.http_protocol:BoundedHttpProtocol",
    )

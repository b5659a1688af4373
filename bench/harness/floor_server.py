"""The floor for the front door: the API's HTTP server answering ``POST /v1/tasks`` with a
constant 202 and no I/O, so the benchmark can say how far Brimful is above it.

    python -m bench.harness.floor_server --port 8090 [--app asgi|fastapi] [--workers 2]

``asgi`` is uvicorn with a bare ASGI callable: the server's own cost. ``fastapi`` adds a
FastAPI route that reads the body and answers a JSONResponse: the framework's cost too.
Both run uvicorn with the API's own options (uvloop, httptools, no access log).
"""

import argparse
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Read the whole body, answer a POST 202 with a fresh task_id (anything else 200:
    the benchmark's readiness check)."""
    if scope["type"] == "lifespan":
        await receive()  # startup: nothing to open
        await send({"type": "lifespan.startup.complete"})
        await receive()  # shutdown
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = b'{"task_id":"%s","status":"queued"}' % uuid.uuid4().hex.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 202 if scope["method"] == "POST" else 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def fastapi_app() -> Any:
    """The factory uvicorn calls for ``--app fastapi`` (in each worker)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False})

    @app.post("/v1/tasks", status_code=202)
    async def submit(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"task_id": uuid.uuid4().hex, "status": "queued"}, status_code=202)

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--app", choices=["asgi", "fastapi"], default="asgi")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    target = "floor_server:asgi_app" if args.app == "asgi" else "floor_server:fastapi_app"
    uvicorn.run(
        target,
        factory=args.app == "fastapi",
        workers=args.workers,
        host="127.0.0.1",
        port=args.port,
        app_dir=str(Path(__file__).resolve().parent),
        log_config=None,
        access_log=False,
    )


if __name__ == "__main__":
    main()

"""The fast lane: ``POST /v1/tasks`` and ``GET /v1/tasks/{task_id}`` straight to their handlers.

Every request pays FastAPI's stack before its handler runs: six middleware layers, the
route table, dependency resolution. For these two routes, the ones every task takes, that
costs more CPU than the bare HTTP server (bench/throughput.py measures both: "the floor").
``FastLane`` wraps the FastAPI app and sends exactly those two method-and-path pairs to
the *same* handler functions with the same caller check, error answers and 500; every
other request, and these paths with any other method, goes through FastAPI unchanged, as
does the OpenAPI document, which still lists both routes. ``BRIMFUL_API_FAST_LANE=false``
sends everything through FastAPI (to compare).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from brimful.api.http.auth import Principal, requires
from brimful.api.http.errors import answer_for
from brimful.api.http.json_answer import JsonAnswer
from brimful.api.http.response_metrics import ROUTE_TEMPLATE_KEY
from brimful.api.tasks.task_routes import TASKS_PATH, get_task, hot_route, submit_task
from brimful.core.api_keys import Scope as KeyScope

log = logging.getLogger("brimful.api")

_submitter = requires(KeyScope.SUBMIT)
_reader = requires(KeyScope.READ)


async def _submit(request: Request) -> Response:
    return await submit_task(request, await _submitter(request))


async def _read(request: Request) -> Response:
    principal: Principal = await _reader(request)
    return JsonAnswer(await get_task(request.path_params["task_id"], request, principal))


def _route(scope: Scope) -> tuple[Callable[[Request], Awaitable[Response]], dict[str, str], str] | None:
    """The fast handler for this request, its path parameters and its route's template,
    or None: FastAPI's to answer."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):  # as Starlette matches routes: below the mount point
        path = path[len(root) :]
    route = hot_route(scope["method"], path)
    if route is None:
        return None
    template, task_id = route
    return (_submit, {}, template) if template == TASKS_PATH else (_read, {"task_id": task_id}, template)


class FastLane:
    """ASGI app: the two hot routes to their handlers, the rest to ``app``."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        handler, scope["path_params"], scope[ROUTE_TEMPLATE_KEY] = route
        scope["app"] = self.app  # the handlers find the API's state through it, as under FastAPI
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except Exception as error:
            answer = answer_for(error)
            if answer is None:
                log.exception("unhandled error", extra={"path": scope["path"]})
                response = PlainTextResponse("Internal Server Error", status_code=500)
            else:
                response = answer
        await response(scope, receive, send)

"""Counting every HTTP answer by route template and status (``brimful_http_responses_total``).

The label is the route's *template* (``/v1/tasks/{task_id}``), never the raw path, so a
client cannot grow the metric's series by inventing paths: whatever matched no route is
counted as ``unmatched``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brimful.core import metrics

UNMATCHED = "unmatched"


def route_template(scope: Scope) -> str:
    """The template of the route that answered, as Starlette recorded it."""
    template = getattr(scope.get("route"), "path", None)
    return template if isinstance(template, str) else UNMATCHED


class ResponseCounter:
    """ASGI wrapper: counts each HTTP answer once, when its status line is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.HTTP_RESPONSES.labels(route_template(scope), str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted_send)

"""The HTTP API: ``create_app(settings)`` builds the ASGI application (FastAPI), with the
direct lane that answers the two routes every task takes inside the HTTP protocol."""

from brimful.api.app import create_app

__all__ = ["create_app"]

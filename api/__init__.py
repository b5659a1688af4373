"""The HTTP API: ``create_app(settings)`` builds the ASGI application (FastAPI, with the
fast lane in front of the two routes every task takes)."""

from brimful.api.app import create_app

__all__ = ["create_app"]

"""Brimful's Python client: ``Client`` (sync) and ``AsyncClient`` (asyncio) for the HTTP API,
the errors they raise, and the retry policy they follow."""

from brimful_client.client import AsyncClient, Client
from brimful_client.plans import BrimfulError, RetryPolicy, TaskFailed, retry_delay

__all__ = ["AsyncClient", "BrimfulError", "Client", "RetryPolicy", "TaskFailed", "retry_delay"]

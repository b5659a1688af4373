"""Brimful's Python client: ``Client`` (sync) and ``AsyncClient`` (asyncio) for the HTTP API,
the errors they raise, the retry policy they follow, and ``task_lines`` (a batch job's
lines from inputs)."""

from brimful_client.client import AsyncClient, Client
from brimful_client.job_plans import task_lines
from brimful_client.plans import BrimfulError, RetryPolicy, TaskFailed, retry_delay

__all__ = ["AsyncClient", "BrimfulError", "Client", "RetryPolicy", "TaskFailed", "retry_delay", "task_lines"]

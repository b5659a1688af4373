"""OpenAI's own client, pointed at a stack as a user would point it."""

from __future__ import annotations

import openai

from brimful.stack import EmbeddedStack


def openai_client(stack: EmbeddedStack, key: str) -> openai.AsyncOpenAI:
    """A client of ``stack`` with ``key``; no retries, so a test sees the first answer."""
    return openai.AsyncOpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0, timeout=60)

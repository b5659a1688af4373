"""Idempotency-Key on ``POST /v1/files`` and ``POST /v1/batches``: a client's retry of a
create gets the object its first try made, never a second one.

The key is the tenant's own, per kind (``files`` or ``batches``), kept with the task
routes' keys (``core/idempotency_keys.py``) under a name no ``/v1/tasks`` key can have (it
holds a space). It is claimed for the new object's id just before the object is recorded,
bound to it once recorded, and freed if the create fails, so a retry of a refused create
runs again. A retry that finds the first still under way waits up to ``WAIT_S``, then is
answered 409 with ``Retry-After``; a claim left pending ``STALE_S`` by a worker that died
mid-create is taken over (bound to the object it made, if it made one). The key is read as ``POST /v1/tasks`` reads its own:
1-255 visible ASCII characters (``api/tasks/idempotency.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Request

from brimful.api.state import ApiState
from brimful.api.tasks.idempotency import checked_idempotency_key, key_in_use
from brimful.core.clock import now_ms

# Whether the object of an id was made (its record written).
Exists = Callable[[str], Awaitable[bool]]

WAIT_S = 5.0
POLL_S = 0.05
STALE_S = 30.0  # a create takes milliseconds once its body is in: a claim this old was left


@dataclass
class CreateClaim:
    """A create under an Idempotency-Key: ``earlier`` is the id its first try made (answer
    that object), or None (this request creates ``new_id``)."""

    new_id: str
    earlier: str | None = None


def request_key(request: Request) -> str | None:
    """The request's Idempotency-Key, checked (400 for a bad one), or None: read at the
    head of a create, so a bad key is refused before anything is read or made."""
    header = request.headers.get("idempotency-key")
    return checked_idempotency_key(header) if header is not None else None


@asynccontextmanager
async def created_once(
    state: ApiState, tenant: str, kind: str, key: str | None, new_id: str, exists: Exists
) -> AsyncIterator[CreateClaim]:
    """Claim the request's Idempotency-Key (``key``, from ``request_key``; None, no claim)
    for ``new_id``. The body creates the object unless ``earlier`` is set; leaving it
    without an error binds the key to ``new_id``, with one frees the key. ``exists``:
    whether an id's object was made (asked of a claim left pending)."""
    claim = CreateClaim(new_id)
    if key is None:
        yield claim
        return
    stored_key = f"{tenant}/ {kind} {key}"
    claim.earlier = await _claim(state, stored_key, new_id, exists)
    if claim.earlier is not None:
        yield claim
        return
    try:
        yield claim
    except BaseException:
        await state.store.idempotency.release(stored_key, new_id)
        raise
    await state.store.idempotency.commit(stored_key, new_id)


async def _claim(state: ApiState, key: str, new_id: str, exists: Exists) -> str | None:
    """None when ``key`` is claimed for ``new_id``; else the id an earlier create made."""
    keys = state.store.idempotency
    deadline = time.monotonic() + WAIT_S
    while True:
        held = await keys.claim(key, new_id)
        if held is None:
            return None
        if not held.pending:
            return held.task_id
        if now_ms() - held.claimed_at_ms > STALE_S * 1000:
            made = await exists(held.task_id)
            if await keys.take_over(key, held, held.task_id if made else new_id):
                if not made:
                    return None
                await keys.commit(key, held.task_id)
                return held.task_id
            continue
        if time.monotonic() >= deadline:
            raise key_in_use()
        await asyncio.sleep(POLL_S)

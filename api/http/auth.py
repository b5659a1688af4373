"""Who is calling: ``Authorization: Bearer <key>`` checked on every request.

Routes declare the scope they need with ``Depends(requires(Scope.X))`` and receive the
caller's ``Principal``. With ``auth_enabled`` off (the embedded local stack) every
caller is the open principal: tenant "", every scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from brimful.api.http.answers import ApiError
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope


@dataclass(frozen=True)
class Principal:
    """The caller: its tenant, what it may do, and its key id (safe to log)."""

    tenant: str
    scopes: frozenset[str]
    key_id: str

    @property
    def tenants_seen(self) -> str | None:
        """Whose dead letters the caller may work on: its own tenant's, or (None) every
        tenant's for an operator key."""
        return None if Scope.OPERATOR.value in self.scopes else self.tenant

    def actor(self, request: Request) -> str:
        """Who did it, for the audit record: the key id, which the caller cannot choose,
        with the name it gives itself (``X-Brimful-Actor``) as a remark."""
        said = request.headers.get("x-brimful-actor", "")[:64]
        return f"key {self.key_id}" + (f" ({said})" if said else "")


OPEN = Principal(tenant="", scopes=frozenset(s.value for s in Scope), key_id="open")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def requires(scope: Scope) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that admits callers whose key holds ``scope``: 401 without a valid
    key, 403 with a key that lacks the scope."""

    async def authenticate_request(request: Request) -> Principal:
        return await authenticate(api_state(request), request.headers.get("authorization"), scope)

    return authenticate_request


async def authenticate(state: ApiState, authorization: str | None, scope: Scope) -> Principal:
    """The caller that sent this ``Authorization`` header, if its key holds ``scope``
    (``requires``, for any lane that has the header without a Starlette request)."""
    if not state.settings.auth_enabled:
        return OPEN
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthenticated", "send Authorization: Bearer <API key>", _CHALLENGE)
    record = await state.api_keys.find(key.strip())
    if record is None or not record.active:
        raise ApiError(401, "unauthenticated", "unknown or revoked API key", _CHALLENGE)
    if not record.allows(scope):
        raise ApiError(403, "forbidden", f"this key lacks the {scope.value!r} scope")
    return Principal(tenant=record.tenant, scopes=frozenset(record.scopes), key_id=record.key_id)

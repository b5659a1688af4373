"""What stands between a request and its route: who is calling, and what a web page may
make a browser send.

Who is calling: ``Authorization: Bearer <key>`` checked on every request. Routes declare the scope they need with ``Depends(requires(Scope.X))`` and receive the
caller's ``Principal``. With ``auth_enabled`` off (the embedded local stack) every
caller is the open principal: tenant "", every scope.

What a web page may make a browser send to the API: nothing it should not. A page on any site can make its visitor's browser send requests to ``127.0.0.1``: a POST
with a ``text/plain`` or form body goes out without a CORS preflight, and a name the page
controls can be made to resolve to loopback (DNS rebinding), so the browser treats the
API as the page's own origin. An open stack (auth off: ``brimful up``) would obey both.
``BrowserGuard`` refuses, before any route runs:

- on an open stack, a ``Host`` that is not a loopback name or one of
  ``api_allowed_hosts``: **403** ``forbidden_host`` (DNS rebinding);
- a write (any method but GET, HEAD, OPTIONS) whose ``Origin`` is not the API's own nor
  one of ``api_cors_origins``: **403** ``cross_origin``;
- a body declared as a form, text or multipart, the types a page may send without asking
  (CORS calls them safelisted): **415** ``unsupported_media_type``, naming the type to
  send. Every route with a body reads JSON (a generic client's ``application/octet-stream``
  is read as such), except the upload routes (``POST /v1/files``), which take
  ``multipart/form-data`` as OpenAI's client sends it: there a page is still stopped by the
  Origin check, which browsers send with every cross-origin form.

Programs (curl, SDKs, the CLI) send no ``Origin`` and a JSON body, and pass untouched.
CORS stays off unless ``api_cors_origins`` names origins: then those, and only those, get
CORS answers (``create_app`` adds Starlette's middleware for them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from fastapi import Request
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from brimful.api.http.bodies import ApiError, JsonAnswer, error_body
from brimful.api.state import ApiState, api_state
from brimful.core.api_keys import Scope
from brimful.core.settings import Settings


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


# --- from api/http/guards.py ---
# What a web page may make a browser send to the API: nothing it should not.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a page may send cross-origin without a preflight, and a form or a script's fetch sends.
_PAGE_TYPES = ("text/", "multipart/", "application/x-www-form-urlencoded")


def host_name(host: str) -> str:
    """The name of a ``Host`` header without its port, lowercased (``[::1]:8080`` -> ``[::1]``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_page_type(content_type: str) -> bool:
    """A form, text or multipart type: what no JSON client sends and any page can."""
    return content_type.split(";", 1)[0].strip().lower().startswith(_PAGE_TYPES)


class BrowserGuard:
    """ASGI wrapper that refuses what only a hostile page would make a browser send."""

    def __init__(self, app: ASGIApp, settings: Settings, upload_paths: frozenset[str] = frozenset()) -> None:
        """``upload_paths``: where a POST may carry ``multipart/form-data``."""
        self.app = app
        self._upload_paths = upload_paths
        self._check_host = not settings.auth_enabled
        self._hosts = LOOPBACK_HOSTS | {host_name(host) for host in settings.allowed_hosts}
        self._origins = frozenset(settings.cors_origins)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _upload(self, method: str, path: str, content_type: str) -> bool:
        """A multipart POST to an upload route: the one page type read."""
        return method == "POST" and path in self._upload_paths and _is_multipart(content_type)

    def refusal(self, scope: AsgiScope) -> JsonAnswer | None:
        """The answer that refuses this request, or None to serve it."""
        return self.refusal_of(scope["method"], scope["path"], scope["headers"], scope.get("scheme", "http"))

    def refusal_of(
        self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], scheme: str
    ) -> JsonAnswer | None:
        """``refusal`` from the request's parts (names lowercased), for a lane with no scope."""
        host = origin = content_type = None
        for name, value in headers:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        if self._check_host and host_name(host or "") not in self._hosts:
            return _refuse(
                403,
                "forbidden_host",
                f"Host {host!r} is not served: an open (unauthenticated) Brimful answers loopback names only; "
                "name it in BRIMFUL_API_ALLOWED_HOSTS, or turn auth on",
            )
        if method in SAFE_METHODS:
            return None
        if origin is not None and origin.rstrip("/") not in self._origins:
            own = f"{scheme}://{(host or '').lower()}"
            if origin.lower().rstrip("/") != own:
                return _refuse(
                    403,
                    "cross_origin",
                    f"a write from origin {origin!r} is refused: this API serves pages of no other origin "
                    "unless BRIMFUL_API_CORS_ORIGINS names it",
                )
        if content_type is not None and is_page_type(content_type) and not self._upload(method, path, content_type):
            return _refuse(
                415,
                "unsupported_media_type",
                f"body of type {content_type.split(';', 1)[0].strip()!r} is not read here: send JSON with "
                "Content-Type: application/json",
            )
        return None


def _is_multipart(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"


def _refuse(status: int, code: str, message: str) -> JsonAnswer:
    return JsonAnswer(error_body(status, code, message), status_code=status)

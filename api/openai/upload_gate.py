"""Who may start an upload now, and how many bytes it may bring.

An upload holds a connection for as long as it trickles, and its bytes stay until deleted,
so each tenant has bounds of its own: uploads under way at once in one worker
(``file_uploads_per_tenant``: 429), uploads started per second across workers (a token
bucket: 429 with Retry-After), and bytes of files kept (``max_stored_bytes``, its tenant
limit: 413 once reached, and an upload is cut where it would pass it). Concurrent uploads
can pass the quota by at most what each of them brings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from brimful.api.http.bodies import ApiError, admit
from brimful.core.file_records import FileRecords
from brimful.core.tenant_limits import RateLimiter, TenantLimitStore


class UploadGate:
    """The bounds every tenant's uploads pass before a byte is read."""

    def __init__(
        self,
        most_at_once: int,
        file_max_bytes: int,
        limiter: RateLimiter,
        records: FileRecords,
        tenant_limits: TenantLimitStore,
    ) -> None:
        self._most_at_once = most_at_once
        self._file_max_bytes = file_max_bytes
        self._limiter = limiter
        self._records = records
        self._tenant_limits = tenant_limits
        self._under_way: Counter[str] = Counter()

    @asynccontextmanager
    async def opened(self, tenant: str) -> AsyncIterator[int]:
        """Hold one of the tenant's upload places while the block runs; the bytes the upload
        may take. Refused (429, 413) before anything is held."""
        if self._under_way[tenant] >= self._most_at_once:
            raise ApiError(
                429,
                "too_many_uploads",
                f"this tenant has {self._most_at_once} uploads under way here; retry once one ends",
                retry_after_s=1,
            )
        self._under_way[tenant] += 1  # before any await: uploads arriving together each see the others
        try:
            await admit(self._limiter, tenant)
            yield await self._room(tenant)
        finally:
            self._under_way[tenant] -= 1
            if not self._under_way[tenant]:
                del self._under_way[tenant]

    async def _room(self, tenant: str) -> int:
        most = (await self._tenant_limits.get(tenant)).max_stored_bytes
        if not most:
            return self._file_max_bytes
        stored = await self._records.stored_bytes(tenant)
        if stored >= most:
            raise ApiError(
                413,
                "storage_quota_exceeded",
                f"this tenant's files take {stored} bytes of its {most}; delete some before uploading more",
            )
        return min(self._file_max_bytes, most - stored)

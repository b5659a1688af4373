"""Webhook events of finished tasks: ``task.completed``, ``task.failed``, ``task.expired``,
for the tenants with an endpoint that takes them.

After each batch the runner announces its tasks that are final, the ones it finished and
the ones it found finished already (a record read again after a crash). An event's
deliveries take ids derived from the task and its state (``core/webhook_records.py``), so
announcing again makes none: a batcher that dies between storing a result and announcing
it is followed by one that reads the record again and announces it then. At least once.
Each tenant's endpoints are read once and kept, and read again whenever any endpoint
changed (one read of a counter a batch), so a task finished after its tenant registered an
endpoint is announced.
"""

from __future__ import annotations

from collections.abc import Sequence

from brimful.core.task_record import TaskStatus, task_record_answer
from brimful.core.task_store import TaskStore
from brimful.core.webhook_records import Endpoint, WebhookRecords
from brimful.workers.batch import BatchItem

EVENTS = {TaskStatus.DONE: "task.completed", TaskStatus.FAILED: "task.failed", TaskStatus.EXPIRED: "task.expired"}
TASK_EVENTS = frozenset(EVENTS.values())


class TaskEvents:
    """Announces a batch's finished tasks to their tenants' webhooks."""

    def __init__(self, webhooks: WebhookRecords, store: TaskStore, default_model: str) -> None:
        self._webhooks = webhooks
        self._store = store
        self._default_model = default_model
        self._endpoints: dict[str, list[Endpoint]] = {}  # tenant -> its endpoints, as last read
        self._version = -1  # of the endpoints read into _endpoints

    async def _endpoints_of(self, tenant: str) -> list[Endpoint]:
        endpoints = self._endpoints.get(tenant)
        if endpoints is None:
            endpoints = self._endpoints[tenant] = await self._webhooks.endpoints(tenant)
        return endpoints

    async def announce(self, items: Sequence[BatchItem]) -> int:
        """Emit the events of the items' final tasks that their tenants want; how many."""
        version = await self._webhooks.endpoints_version()
        if version != self._version:  # an endpoint was added or removed: read them again
            self._endpoints.clear()
            self._version = version
        by_tenant: dict[str, list[BatchItem]] = {}
        for item in items:
            by_tenant.setdefault(item.request.tenant, []).append(item)
        emitted = 0
        for tenant, tenant_items in by_tenant.items():
            endpoints = await self._endpoints_of(tenant)
            wanted = frozenset(event for endpoint in endpoints for event in endpoint.events)
            # Tasks with a callback are announced whatever the tenant's endpoints take.
            told = [item for item in tenant_items if item.request.callback_url or wanted & TASK_EVENTS]
            if not told:
                continue
            records = await self._store.get_many([item.task_id for item in told])
            for item, record in zip(told, records):
                event = EVENTS.get(record.status) if record is not None else None
                if record is None or event is None:
                    continue
                callback = item.request.callback_url
                if event not in wanted and not callback:
                    continue
                answer = task_record_answer(item.task_id, record, self._default_model)
                made = await self._webhooks.emit(
                    tenant, event, answer, f"{item.task_id}:{event}", callback_url=callback, endpoints=endpoints
                )
                emitted += len(made)
        return emitted

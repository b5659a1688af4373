"""Which batch job a driver steps next: a pure decision, so one tenant's jobs never hold
back another's.

A driver looks at every active job (at most ``MAX_ACTIVE_JOBS``), but a look has a time budget,
so the order decides who waits. Jobs are taken one tenant at a time in turn (each tenant's
least recently stepped job first, tenants ordered by how long their next job has waited),
so a tenant with a hundred jobs gets one step for every step each other tenant gets; a new
job, never stepped, goes before every job of its tenant that has been.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

NEVER = float("-inf")


def turns(oldest_first: Sequence[str], tenants: Mapping[str, str], stepped_at: Mapping[str, float]) -> list[str]:
    """The jobs of ``oldest_first`` in the order to step them. ``tenants``: each job's tenant
    (unknown: a tenant of its own); ``stepped_at``: when each was last stepped (monotonic)."""
    queues: dict[str, list[str]] = {}
    for batch_id in oldest_first:
        queues.setdefault(tenants.get(batch_id, batch_id), []).append(batch_id)
    for queue in queues.values():  # stable: among never-stepped jobs the oldest first
        queue.sort(key=lambda batch_id: stepped_at.get(batch_id, NEVER))
    order = sorted(queues, key=lambda tenant: stepped_at.get(queues[tenant][0], NEVER))
    longest = max((len(queue) for queue in queues.values()), default=0)
    return [queues[tenant][round_] for round_ in range(longest) for tenant in order if round_ < len(queues[tenant])]

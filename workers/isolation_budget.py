"""How many model calls each tenant's failing rows may cost: a pure decision on an
injected clock.

Finding which rows of a refused batch fail costs extra model calls (halving, then retries
of a row alone): about four per failing row. Without a bound, a tenant that sends rows the
model always refuses buys a share of the GPU for free. Each tenant has a token bucket of
isolation calls per batcher; once it is empty, that tenant's refused rows fail at once
(to the DLQ, with the reason), and no other tenant's rows are held back, because a refused
batch is first split by tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IsolationBudget:
    """A token bucket of isolation calls per tenant: ``burst`` at most, refilled at
    ``calls_per_s``. ``burst`` 0 turns the bound off."""

    calls_per_s: float = 1.0
    burst: int = 200
    max_tenants: int = 10_000  # buckets kept; the fullest are dropped first (a full bucket is the default)
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # tenant -> (tokens, at)

    def take(self, tenant: str, now: float) -> bool:
        """Take one call for ``tenant`` at ``now`` (seconds); False when its budget is spent."""
        if self.burst <= 0:
            return True
        tokens, at = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - at) * self.calls_per_s)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            return False
        self._buckets[tenant] = (tokens - 1.0, now)
        if len(self._buckets) > self.max_tenants:
            self._forget_fullest(now)
        return True

    def _forget_fullest(self, now: float) -> None:
        def level(item: tuple[str, tuple[float, float]]) -> float:
            tokens, at = item[1]
            return tokens + max(0.0, now - at) * self.calls_per_s

        for tenant, _ in sorted(self._buckets.items(), key=level, reverse=True)[: len(self._buckets) // 10 + 1]:
            del self._buckets[tenant]

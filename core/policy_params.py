"""The flush policy's parameters: shared by the batchers that apply them, the store that
tunes them live (``policy_tuning``) and the simulator that replays them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyParams:
    """Tunable parameters; all durations in seconds."""

    batch_size: int = 64
    max_wait: float = 0.250
    min_wait: float = 0.002
    # Submit-to-result time the policy keeps within when the model pool has room: it waits
    # for rows only while the batch can still leave in time for it (the measured time a
    # task spends before the batcher and after its call counted).
    latency_target: float = 0.105
    rate_halflife: float = 0.500
    fill_slack: float = 1.25
    min_worthwhile_rows: float = 8.0
    low_max_wait: float = 30.0  # a low-priority row's longest wait for a spare slot (batcher/backfill.py)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= self.min_wait <= self.max_wait:
            raise ValueError("need 0 <= min_wait <= max_wait")
        if self.max_wait <= 0:
            raise ValueError("max_wait must be positive")
        if self.latency_target <= 0:
            raise ValueError("latency_target must be positive")
        if self.rate_halflife <= 0:
            raise ValueError("rate_halflife must be positive")
        if self.fill_slack < 1:
            raise ValueError("fill_slack must be at least 1")
        if self.min_worthwhile_rows < 0:
            raise ValueError("min_worthwhile_rows must not be negative")
        if self.low_max_wait <= 0:
            raise ValueError("low_max_wait must be positive")

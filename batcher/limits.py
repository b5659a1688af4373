"""Bounds on the work one batcher process holds, from Settings (their one source)."""

from __future__ import annotations

from dataclasses import dataclass

from brimful.core.settings import Settings, default_of


@dataclass(frozen=True)
class BatcherLimits:
    """Bounds on work held by one batcher process."""

    # Defaults, and what each means, are the settings' (core/settings.py).
    max_in_flight: int = default_of("max_in_flight")
    max_in_flight_per_partition: int = default_of("max_in_flight_per_partition")
    max_pending_per_partition: int = default_of("max_pending_per_partition")
    max_low_pending_per_partition: int = default_of("max_low_pending_per_partition")
    commit_timeout_s: float = default_of("kafka_commit_timeout_s")
    commit_every_s: float = (
        default_of("kafka_commit_every_ms") / 1000
    )  # commits of batches finishing within this go as one
    # How long after a batch's results are stored its offsets may be committed: a Redis
    # that syncs its log every second can lose that much to a kill, and the records of
    # what it lost must be read again (their tasks are re-created and computed).
    commit_after_stored_s: float = default_of("kafka_commit_after_stored_ms") / 1000
    revoke_wait_s: float = 2.0
    shutdown_wait_s: float = 30.0
    store_retry_s: float = 0.5
    # How long a gap in a partition's offsets is read again before it counts as real
    # (batcher/partition_state.py): the embedded broker's unreadable records become readable within
    # milliseconds; on Apache Kafka a real gap (compaction, transaction markers) costs this once.
    gap_patience_s: float = 1.0

    @classmethod
    def from_settings(cls, settings: Settings) -> BatcherLimits:
        """The limits the settings set; the rest keep their defaults."""
        return cls(
            max_in_flight=settings.max_in_flight,
            max_in_flight_per_partition=settings.max_in_flight_per_partition,
            max_pending_per_partition=settings.max_pending_per_partition,
            max_low_pending_per_partition=settings.max_low_pending_per_partition,
            commit_timeout_s=settings.kafka_commit_timeout_s,
            commit_every_s=settings.kafka_commit_every_ms / 1000,
            commit_after_stored_s=settings.kafka_commit_after_stored_ms / 1000,
        )

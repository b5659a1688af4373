"""How long the batcher lets the broker hold a fetch: short while caught up, longer while
a partition lags and fetches still come back empty.

A fetch's wait is the most the broker may hold it looking for data. Short is right while
the batcher is caught up, since a broker that holds a fetch past its records' arrival
(Tansu in memory mode does: an empty fetch lasts its whole wait, and records arriving
meanwhile are answered some ms later) would otherwise deliver arrivals late and in lumps. But a broker that reads
old records slowly (Tansu on S3 storage after a restart: one object read per record
batch) answers a short fetch with nothing when the wait ends before its first read does,
and the batcher then never gets past its position. So while a partition's high watermark
is above the fetch position and fetches bring nothing, the wait doubles, up to a ceiling;
it stays there while the batcher catches up, and drops back once it has. Apache Kafka
answers as soon as records are there, so against it the wait only grows in the rare case
where the records between position and high watermark are not readable (aborted
transactions), and harmlessly.

Pure logic: ``FetchPacer`` (``fetch_pacer``) reads a consumer and applies it.
"""

from __future__ import annotations


class FetchWait:
    """The fetch wait to ask for next, from what the last fetch brought."""

    def __init__(self, base_ms: int, ceiling_ms: int) -> None:
        if ceiling_ms < base_ms:
            raise ValueError("the ceiling of the fetch wait must not be below its base")
        self.base_ms = base_ms
        self.ceiling_ms = ceiling_ms
        self.current_ms = base_ms

    def after_fetch(self, got_records: bool, lagging: bool) -> int:
        """The wait for the next fetch. ``lagging``: some partition being fetched has
        records past the consumer's position."""
        if not lagging:
            self.current_ms = self.base_ms  # caught up: answer arrivals promptly again
        elif not got_records:
            # Doubling reaches a 4 s ceiling from 20 ms in eight empty fetches.
            self.current_ms = min(self.ceiling_ms, max(2 * self.current_ms, self.base_ms + 1))
        # Records while still lagging: keep the wait that brought them.
        return self.current_ms

    def rebase(self, base_ms: int) -> int:
        """Take a new base, the wait while caught up (a topic generation no send goes to
        any more fetches less often), at most the ceiling; the wait for the next fetch. A
        wait lengthened for a lagging partition is kept until it is caught up, as ever."""
        caught_up = self.current_ms == self.base_ms
        self.base_ms = min(base_ms, self.ceiling_ms)
        if caught_up or self.current_ms < self.base_ms:
            self.current_ms = self.base_ms
        return self.current_ms

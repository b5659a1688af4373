"""Identical tasks computed once (the same model, version, inputs and, unless results may
cross tenants, tenant: ``workers/result_cache.py``).

A task whose result the batcher's cache holds is answered from it; of the identical tasks
in one batch the model sees one row, whose result or failure every one of them gets; and
a task identical to one that another batch of this batcher is computing waits for that
row's result. If that row fails, or its batch stops, the waiting task is computed in its
own batch: a failure is never shared beyond the batch it happened in. A task may opt out,
and a model may be marked not cacheable (then nothing here is used)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brimful.core import metrics
from brimful.core.model_signature import ModelSignature
from brimful.core.stats import StatsField
from brimful.core.task_store import TaskStore
from brimful.workers.batch import BatchItem, BatchOutcome, observe_latency
from brimful.workers.batch_rows import known_tasks
from brimful.workers.result_cache import ResultCache, cache_key, plan_batch

# A group of identical tasks: the key they share (None: not shareable), the task whose row
# is computed first, then its twins.
Group = tuple[bytes | None, list[BatchItem]]


@dataclass
class Followers:
    """Identical tasks of a batch whose row another batch is computing right now."""

    key: bytes
    computing: asyncio.Future[dict[str, Any] | None]  # its result; None: that row failed or its batch stopped
    items: list[BatchItem]


class SharedRows:
    """The rows of a batcher's running batches, and the results they share."""

    def __init__(
        self, signature: ModelSignature, store: TaskStore, cache: ResultCache | None, across_tenants: bool
    ) -> None:
        """``cache``: finished results kept for identical tasks (None: none kept; identical
        tasks of one batch are still computed once). ``across_tenants``: identical tasks
        of different tenants share a result."""
        self.signature = signature
        self.store = store
        self.cache = cache
        self.across_tenants = across_tenants
        # Keys some running batch is computing now: a later batch's identical task waits
        # for that result instead of computing it again.
        self._computing: dict[bytes, asyncio.Future[dict[str, Any] | None]] = {}

    def key(self, item: BatchItem) -> bytes | None:
        return cache_key(item.request, self.signature.name, self.signature.version, self.across_tenants)

    async def answer_identical(
        self, items: list[BatchItem], outcome: BatchOutcome
    ) -> tuple[list[BatchItem], list[Followers]]:
        """Answer the tasks whose result the cache holds, note the identical ones among the
        rest, and return the rows the model must compute (one per distinct task) and the
        tasks that wait for a row another batch is computing."""
        cache = self.cache
        plan = plan_batch(items, self.key, lambda key: None if cache is None else cache.get(key))
        own: list[Group] = []
        followers: list[Followers] = []
        for row, (item, key) in enumerate(zip(plan.computed, plan.keys)):
            group = [item, *plan.duplicates.get(row, ())]
            computing = None if key is None else self._computing.get(key)
            if key is None or computing is None:
                own.append((key, group))
            else:
                followers.append(Followers(key, computing, group))
        computed = self.lead(own, outcome)
        outcome.stats[StatsField.CACHE_HITS] += len(plan.hits)
        metrics.CACHE_HITS.inc(len(plan.hits))
        if plan.hits:
            # The batch's counters so far ride along: the round trip is needed anyway.
            outcome.done += await self.store.mark_done(
                {item.task_id: outputs for item, outputs in plan.hits},
                outcome.stats,
                done_counter=StatsField.TASKS_DONE,
                cached=True,
                known=known_tasks((item for item, _ in plan.hits), self.signature.name),
            )
            outcome.stats.clear()
            observe_latency([item for item, _ in plan.hits])
        return computed, followers

    def lead(self, groups: list[Group], outcome: BatchOutcome) -> list[BatchItem]:
        """The rows this batch computes, one per group of identical tasks: noted so the
        group's other tasks share its result and, while it is computed, so later batches'
        identical tasks wait for it."""
        rows: list[BatchItem] = []
        hits = misses = 0
        for key, (item, *twins) in groups:
            rows.append(item)
            if key is None:
                continue
            outcome.keys[item.task_id] = key
            if twins:
                outcome.twins[item.task_id] = twins
            if key not in self._computing:
                future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
                self._computing[key] = outcome.leading[key] = future
            hits += len(twins)
            misses += 1
        # Counted once a batch, not once a row: this is on every batch's path.
        outcome.stats[StatsField.CACHE_HITS] += hits
        outcome.stats[StatsField.CACHE_MISSES] += misses
        metrics.CACHE_HITS.inc(hits)
        metrics.CACHE_MISSES.inc(misses)
        return rows

    async def follow(self, followers: list[Followers], outcome: BatchOutcome) -> list[Group]:
        """Store each waiting group's result as the batch computing it finishes; return the
        groups whose row failed or whose batch stopped, to be computed by this batch."""
        orphans: list[Group] = []
        # asyncio.wait never cancels what it waits on: if this batch stops, the computing
        # batch is untouched.
        pending = {group.computing for group in followers}
        while pending:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            answered: dict[str, dict[str, Any]] = {}
            items: list[BatchItem] = []
            for group in followers:
                if group.computing not in finished:
                    continue
                result = group.computing.result()
                if result is None:
                    orphans.append((group.key, group.items))
                    continue
                answered.update((item.task_id, result) for item in group.items)
                items += group.items
            if answered:
                hits = Counter({StatsField.CACHE_HITS: len(answered)})
                outcome.done += await self.store.mark_done(
                    answered,
                    hits,
                    done_counter=StatsField.TASKS_DONE,
                    cached=True,
                    known=known_tasks(items, self.signature.name),
                )
                metrics.CACHE_HITS.inc(len(answered))
                observe_latency(items)
        return orphans

    def computed(
        self,
        outcome: BatchOutcome,
        items: list[BatchItem],
        results: dict[str, dict[str, Any]],
        encoded: Mapping[str, bytes],
    ) -> tuple[dict[str, bytes], list[BatchItem]]:
        """The batch computed these rows (``encoded``: each result's JSON): keep their
        results for identical tasks to come, give them to the batches waiting, and return
        the copies for this batch's twins (by task id, as JSON) with the twins."""
        shared: dict[str, bytes] = {}
        twins: list[BatchItem] = []
        for item in items:
            task_id = item.task_id
            key = outcome.keys.get(task_id)
            if key is not None:
                if self.cache is not None:
                    self.cache.put(key, results[task_id], len(encoded[task_id]))
                self.settle(outcome, key, results[task_id])
            for twin in outcome.twins.get(task_id, ()):
                shared[twin.task_id] = encoded[task_id]
                twins.append(twin)
        if self.cache is not None:
            metrics.CACHE_BYTES.set(self.cache.bytes)
        return shared, twins

    def failed(self, outcome: BatchOutcome, items: list[BatchItem]) -> list[tuple[BatchItem, BatchItem]]:
        """These rows failed: the batches waiting on them compute their own (a failure is
        not shared beyond this batch); returns (row, twin) for the twins that fail with them."""
        for item in items:
            key = outcome.keys.get(item.task_id)
            if key is not None:
                self.settle(outcome, key, None)
        return [(item, twin) for item in items for twin in outcome.twins.get(item.task_id, ())]

    def settle(self, outcome: BatchOutcome, key: bytes, result: dict[str, Any] | None) -> None:
        """Give the batches waiting on ``key`` its result (None: compute it yourselves)."""
        future = outcome.leading.pop(key, None)
        if future is None:
            return
        if self._computing.get(key) is future:
            del self._computing[key]
        if not future.done():
            future.set_result(result)

    def release(self, outcome: BatchOutcome) -> None:
        """The batch ended: what it never computed, the batches waiting on it compute."""
        for key in list(outcome.leading):
            self.settle(outcome, key, None)

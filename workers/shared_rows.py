"""Identical tasks computed once (the same model, version, inputs and, unless results may
cross tenants, tenant: ``cache_key``).

A task whose result the batcher's cache holds is answered from it; of the identical tasks
in one batch the model sees one row, whose result or failure every one of them gets; and
a task identical to one that another batch of this batcher is computing waits for that
row's result. If that row fails, or its batch stops, the waiting task is computed in its
own batch: a failure is never shared beyond the batch it happened in. A task may opt out,
and a model may be marked not cacheable (then nothing here is used).

The pieces below the class are pure and in memory, one per batcher process:
``ResultCache`` holds finished outputs by key, least recently used first out, within a
byte budget; ``cache_key`` says which tasks are the same question to the same model;
``plan_batch`` splits a batch's tasks into those answered from the cache, those the model
must see (one per key) and the duplicates that share a computed row's result."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from brimful.core import metrics
from brimful.core.model_catalogue import ModelSignature
from brimful.core.stats import StatsField
from brimful.core.task_store import TaskStore
from brimful.schemas import TaskRequest
from brimful.workers.batch import BatchItem, BatchOutcome, known_tasks, observe_latency

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
                provenance=outcome.provenance_of(item for item, _ in plan.hits),
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
                    provenance=outcome.provenance_of(items),
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


Item = TypeVar("Item")
Key = TypeVar("Key", bound=Hashable)

# What one entry costs besides its outputs: the key, the dict and the ordering (measured
# with tracemalloc on small outputs: ~300 bytes); counted so a flood of tiny results is
# bounded too.
ENTRY_OVERHEAD_BYTES = 320


def cache_key(request: TaskRequest, model: str, version: str, across_tenants: bool) -> bytes | None:
    """The key of a task's result: its model, that model's version and its exact inputs,
    and its tenant unless results may cross tenants. None when the task opted out."""
    if request.no_cache:
        return None
    tenant = b"" if across_tenants else request.tenant.encode()
    parts = [model.encode(), b"\x00", version.encode(), b"\x00", tenant, b"\x00"]
    inputs = request.inputs
    for name in sorted(inputs) if len(inputs) > 1 else inputs:
        tensor = inputs[name].SerializeToString(deterministic=True)
        parts += (name.encode(), b"\x00", len(tensor).to_bytes(8, "little"), tensor)
    # One digest of the parts joined: a hash object fed a piece at a time cost a row ten calls.
    return hashlib.sha256(b"".join(parts)).digest()


class ResultCache:
    """Outputs by key, at most ``max_bytes`` of them (by their JSON size plus a fixed
    overhead each); the least recently used leave first. ``max_bytes`` 0: keeps nothing."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, tuple[dict[str, Any], int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> dict[str, Any] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, outputs: dict[str, Any], encoded_size: int | None = None) -> None:
        """Keep ``outputs``; ``encoded_size``: their JSON's length, where the caller has it."""
        size = (len(orjson.dumps(outputs)) if encoded_size is None else encoded_size) + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes:
            return  # larger than the whole budget: never worth evicting everything for
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (outputs, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed


@dataclass
class BatchPlan(Generic[Item, Key]):
    """A batch's tasks, split: ``hits`` answered from the cache (with their outputs),
    ``computed`` the rows the model sees (one per key), and ``duplicates``: by the index
    in ``computed`` of the row computed for them, the tasks that share its result."""

    hits: list[tuple[Item, dict[str, Any]]] = field(default_factory=list)
    computed: list[Item] = field(default_factory=list)
    keys: list[Key | None] = field(default_factory=list)  # per computed row: its key, if any
    duplicates: dict[int, list[Item]] = field(default_factory=dict)


def plan_batch(
    items: Sequence[Item], key_of: Callable[[Item], Key | None], lookup: Callable[[Key], dict[str, Any] | None]
) -> BatchPlan[Item, Key]:
    """Split ``items`` (in order) by their keys: a task without a key is computed alone."""
    plan: BatchPlan[Item, Key] = BatchPlan()
    first_with_key: dict[Key, int] = {}
    for item in items:
        key = key_of(item)
        if key is None:
            plan.computed.append(item)
            plan.keys.append(None)
            continue
        cached = lookup(key)
        if cached is not None:
            plan.hits.append((item, cached))
        elif key in first_with_key:
            plan.duplicates.setdefault(first_with_key[key], []).append(item)
        else:
            first_with_key[key] = len(plan.computed)
            plan.computed.append(item)
            plan.keys.append(key)
    return plan

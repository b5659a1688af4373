"""Results of identical inputs, kept so the model computes them once.

Pure and in memory, one per batcher process: ``ResultCache`` holds finished outputs by
key, least recently used first out, within a byte budget; ``cache_key`` says which tasks
are the same question to the same model; ``plan_batch`` splits a batch's tasks into those
answered from the cache, those the model must see (one per key) and the duplicates that
share a computed row's result.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from brimful.schemas import TaskRequest

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

"""The result cache's pure parts: which tasks are the same question (the key), how a batch
splits into cached, computed and identical tasks, and the byte bound on what is kept."""

from __future__ import annotations

import orjson

from brimful.schemas import InputTensor, TaskRequest
from brimful.workers.shared_rows import ENTRY_OVERHEAD_BYTES, ResultCache, cache_key, plan_batch


def request(text: bytes, tenant: str = "a", no_cache: bool = False, task_id: str = "t") -> TaskRequest:
    message = TaskRequest(task_id=task_id, model="m", tenant=tenant, no_cache=no_cache)
    message.inputs["TEXT"].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[text]))
    return message


def test_the_key_covers_model_version_inputs_and_tenant_and_nothing_else() -> None:
    base = cache_key(request(b"x"), "m", "1", across_tenants=False)
    assert base is not None
    # Another task id, submission time or deadline asks the same question.
    other = request(b"x", task_id="u")
    other.submitted_at_ms, other.deadline_at_ms = 5, 9
    assert cache_key(other, "m", "1", across_tenants=False) == base
    for different in (
        cache_key(request(b"y"), "m", "1", across_tenants=False),
        cache_key(request(b"x"), "m16", "1", across_tenants=False),
        cache_key(request(b"x"), "m", "2", across_tenants=False),
        cache_key(request(b"x", tenant="b"), "m", "1", across_tenants=False),
    ):
        assert different != base
    # Only where the operator lets results cross tenants do two tenants share one.
    assert cache_key(request(b"x", tenant="b"), "m", "1", across_tenants=True) == cache_key(
        request(b"x"), "m", "1", across_tenants=True
    )
    assert cache_key(request(b"x", no_cache=True), "m", "1", across_tenants=False) is None


def test_the_key_does_not_confuse_a_boundary_moved_between_fields() -> None:
    # "ab" + "" and "a" + "b" must differ: every part is length- or separator-delimited.
    one, two = request(b"ab"), request(b"a")
    two.inputs["TEXT"].bytes_contents.append(b"b")
    assert cache_key(one, "m", "1", False) != cache_key(two, "m", "1", False)
    assert cache_key(request(b"x", tenant="1"), "m", "", False) != cache_key(request(b"x", tenant=""), "m", "1", False)


def test_a_key_of_several_inputs_follows_their_names_not_the_order_they_were_set() -> None:
    def inputs(*pairs: tuple[str, bytes]) -> TaskRequest:
        message = TaskRequest(task_id="t", model="m", tenant="a")
        for name, value in pairs:
            message.inputs[name].CopyFrom(InputTensor(datatype="BYTES", shape=[1], bytes_contents=[value]))
        return message

    forwards = cache_key(inputs(("A", b"x"), ("B", b"y")), "m", "1", False)
    assert cache_key(inputs(("B", b"y"), ("A", b"x")), "m", "1", False) == forwards
    assert cache_key(inputs(("A", b"y"), ("B", b"x")), "m", "1", False) != forwards
    # The same two values under other names are another question.
    assert cache_key(inputs(("A", b"x"), ("C", b"y")), "m", "1", False) != forwards


def test_a_batch_splits_into_hits_computed_rows_and_their_twins() -> None:
    cached = {"k1": {"Y": 1}}
    items = ["k1", None, "k2", "k2", None, "k3", "k2", "k1"]
    plan = plan_batch(list(enumerate(items)), lambda item: item[1], cached.get)
    assert [(item, outputs) for item, outputs in plan.hits] == [((0, "k1"), {"Y": 1}), ((7, "k1"), {"Y": 1})]
    assert plan.computed == [(1, None), (2, "k2"), (4, None), (5, "k3")]  # an item without a key: alone
    assert plan.keys == [None, "k2", None, "k3"]
    assert plan.duplicates == {1: [(3, "k2"), (6, "k2")]}


def test_the_cache_keeps_within_its_bytes_least_recently_used_out_first() -> None:
    outputs = {"SHA256": "0" * 64, "LENGTH": 5}
    size = len(orjson.dumps(outputs)) + ENTRY_OVERHEAD_BYTES
    cache = ResultCache(max_bytes=3 * size)
    for key in (b"a", b"b", b"c"):
        cache.put(key, outputs)
    assert len(cache) == 3 and cache.bytes == 3 * size
    assert cache.get(b"a") == outputs  # now the most recently used
    cache.put(b"d", outputs)
    assert cache.get(b"b") is None and cache.get(b"a") == outputs and len(cache) == 3
    assert cache.bytes <= cache.max_bytes
    cache.put(b"a", {"SHA256": "1" * 64, "LENGTH": 6})  # replaced, not counted twice
    assert len(cache) == 3 and cache.bytes == 3 * size
    cache.put(b"huge", {"X": "y" * (4 * size)})  # larger than the budget: not kept, nothing evicted
    assert cache.get(b"huge") is None and len(cache) == 3


def test_a_cache_of_no_bytes_keeps_nothing() -> None:
    cache = ResultCache(max_bytes=0)
    cache.put(b"a", {"Y": 1})
    assert cache.get(b"a") is None and cache.bytes == 0

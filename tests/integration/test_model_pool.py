"""The pool of model endpoints against real Triton servers: several PyTriton hosts on
loopback, two batchers sharing them, an endpoint killed mid-run, names re-resolved."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from redis.asyncio import Redis

from brimful.batcher.main import model_pool
from brimful.core.redis_keys import RedisKeys
from brimful.stack import EmbeddedStack, free_port, sample_sums
from brimful.workers.model_pool import resolve_all
from tests.helpers.pipeline import expected_outputs, random_text, read_dead_letters
from tests.helpers.polling import wait_for
from tests.helpers.stacks import stack_settings, start_stack
from tests.helpers.task_client import TaskClient

CALL_MS = 20  # a GPU-like model: every call takes at least this long


@pytest.fixture(scope="module")
def pool_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """Two model endpoints (one slot each), two partitions, two batchers sharing them."""
    settings = stack_settings(
        triton_url=f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}",
        topic_partitions=2,
        endpoint_capacity=1,
        breaker_failure_threshold=2,
        batcher_metrics_port=0,  # two batchers on one host
        tuning_poll_ms=100,  # the status board, where the test watches breakers, every 100 ms
    )
    stack = start_stack(tmp_path_factory.mktemp("pool-stack"), settings, model_host_args=("--call-ms", str(CALL_MS)))
    try:
        stack.start_batcher()
        stack.wait_for_batchers()
        yield stack
    finally:
        stack.stop()


@pytest.fixture
async def pool_client(pool_stack: EmbeddedStack) -> AsyncIterator[TaskClient]:
    async with TaskClient(pool_stack.api_url) as client:
        yield client


async def triton_metrics(stack: EmbeddedStack, host: str) -> dict[str, float]:
    """The model's counters from one Triton server's own /metrics."""
    metrics_port = stack.model_host_ports[host][2]
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        return sample_sums(await response.text(), model=stack.settings.model_name)


async def submit_and_check(client: TaskClient, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = [random_text(rng) for _ in range(count)]
    task_ids = []
    for start in range(0, count, 100):  # steady rather than one burst: the policy sees a rate
        task_ids += await asyncio.gather(*(client.submit({"TEXT": t}) for t in texts[start : start + 100]))
    results = await asyncio.gather(*(client.wait_final(t, timeout_s=120, interval_s=0.1) for t in task_ids))
    for text, result in zip(texts, results):
        assert result["status"] == "done", result
        assert result["outputs"] == expected_outputs(text)
    return task_ids


async def test_two_batchers_share_two_endpoints_without_sending_either_more_than_its_capacity(
    pool_stack: EmbeddedStack, pool_client: TaskClient
) -> None:
    hosts = pool_stack.model_host_names
    before = {host: await triton_metrics(pool_stack, host) for host in hosts}
    await submit_and_check(pool_client, 3000, seed=1)
    after = {host: await triton_metrics(pool_stack, host) for host in hosts}
    calls = {
        h: after[h]["nv_inference_request_success_total"] - before[h]["nv_inference_request_success_total"]
        for h in hosts
    }
    queued_us = {
        h: after[h]["nv_inference_queue_duration_us_total"] - before[h]["nv_inference_queue_duration_us_total"]
        for h in hosts
    }
    print(
        f"\ncalls per endpoint {calls}; mean time queued inside Triton per call (ms): "
        f"{ {h: round(queued_us[h] / 1000 / max(1, calls[h]), 3) for h in hosts} }"
    )
    # Both endpoints served, and neither was sent a call while its one slot was taken:
    # such a call would wait in Triton's queue for the running one (20 ms).
    assert all(count > 0 for count in calls.values()), calls
    for host in hosts:
        assert queued_us[host] / calls[host] < 2_000, (host, queued_us[host] / calls[host])
    stats = await pool_client.stats()
    assert len(stats["batchers"]) == 2
    for batcher in stats["batchers"]:
        endpoints = {e["url"]: e for e in batcher["endpoints"]}
        assert set(endpoints) == set(pool_stack.settings.triton_endpoints)
        assert all(e["capacity"] == 1 and e["breaker"] == "closed" for e in endpoints.values())
        assert sum(e["calls"] for e in endpoints.values()) > 0


async def test_an_endpoint_killed_mid_run_loses_its_share_within_seconds_and_nothing_is_lost(
    pool_stack: EmbeddedStack, pool_client: TaskClient
) -> None:
    letters_before = len(await read_dead_letters(pool_stack))
    victim = pool_stack.model_host_names[1]
    victim_url = pool_stack.settings.triton_endpoints[1]
    submitting = asyncio.create_task(submit_and_check(pool_client, 3000, seed=2))
    try:
        await asyncio.sleep(1.0)  # under way: batches at both endpoints
        pool_stack.processes[victim].kill()
        killed_at = time.monotonic()
        # Every batcher stops sending it calls: its circuit leaves "closed". The first batcher
        # whose calls fail announces it and the others open theirs on that news, instead of
        # each learning from its own failed calls (0.8-1.1 s here for one with little
        # traffic there before the news was shared). Seen through the status board,
        # published every 100 ms.
        while True:
            views = [{e["url"]: e for e in b["endpoints"]}[victim_url] for b in (await pool_client.stats())["batchers"]]
            if all(view["breaker"] != "closed" for view in views):
                break
            # A bound for "within seconds", not a measurement: the first batcher opens it after
            # its second failed call there, which waits for traffic the pool already steers
            # elsewhere (0.5-1.35 s in 6 runs here). The sharing itself is the next test's.
            assert time.monotonic() - killed_at < 3.0, views
            await asyncio.sleep(0.05)
        print(f"\ntraffic off the killed endpoint after {time.monotonic() - killed_at:.2f} s")
        await submitting  # every task done with its own result
    finally:
        submitting.cancel()
        await asyncio.to_thread(pool_stack.restart, victim)
    assert len(await read_dead_letters(pool_stack)) == letters_before

    # The endpoint back: the batchers' probes close its circuit again.
    async def rejoined() -> bool:
        return all(
            {e["url"]: e for e in b["endpoints"]}[victim_url]["breaker"] == "closed"
            for b in (await pool_client.stats())["batchers"]
        )

    await wait_for(rejoined, 30, "the restarted endpoint to rejoin")


async def test_news_of_an_endpoint_down_opens_its_circuit_on_every_batcher(
    pool_stack: EmbeddedStack, pool_client: TaskClient
) -> None:
    """What a batcher announces when it opens an endpoint's circuit: every batcher opens its
    own at once, and, the endpoint being well, probes close them again."""
    url = pool_stack.settings.triton_endpoints[0]

    async def breakers() -> list[str]:
        return [{e["url"]: e for e in b["endpoints"]}[url]["breaker"] for b in (await pool_client.stats())["batchers"]]

    async def closed_on_both() -> bool:  # both batchers on the status board, the circuit closed on each
        return await breakers() == ["closed", "closed"]

    await wait_for(closed_on_both, 30, "the circuit closed on both batchers")
    redis = Redis.from_url(pool_stack.settings.redis_url)
    try:
        await redis.publish(RedisKeys(pool_stack.settings.key_prefix).endpoint_down_channel, url)
    finally:
        await redis.aclose()

    async def opened_on_both() -> bool:  # the status board is published every 100 ms
        return all(state != "closed" for state in await breakers())

    await wait_for(opened_on_both, 10, "the news to open the circuit on both batchers", interval_s=0.05)
    # With no traffic to wake them, the batchers still probe it: an open period (at most 0.5 s
    # at first), then a readiness check.
    await wait_for(closed_on_both, 10, "a probe to close the circuit of an endpoint that serves")


async def test_endpoint_names_are_re_resolved_without_a_restart(pool_stack: EmbeddedStack) -> None:
    first, second = pool_stack.settings.triton_endpoints
    records = {"models.pool.test": [first]}

    async def resolve(host: str, port: int) -> list[str]:  # a headless Service's records, changing
        return list(records[host])

    settings = pool_stack.settings.model_copy(update={"triton_url": "models.pool.test:1", "triton_resolve_dns": True})
    redis = Redis.from_url(settings.redis_url)
    pool = model_pool(settings, redis, RedisKeys(settings.key_prefix), resolve=resolve)  # this test's DNS
    try:
        await pool.refresh()
        assert [e["url"] for e in pool.summary()] == [first]
        assert await pool.any_model().is_ready()
        records["models.pool.test"] = [first, second]
        await pool.refresh()
        assert sorted(e["url"] for e in pool.summary()) == sorted([first, second])
        held = [pool.reserve(64) for _ in range(2)]  # one slot each: both endpoints now take calls
        assert {slot.endpoint.url for slot in held if slot is not None} == {first, second}
        records["models.pool.test"] = [second]
        await pool.refresh()
        assert pool.reserve(64) is None  # first is retired (no new calls), second is busy
        for slot in held:
            pool.release(slot)  # type: ignore[arg-type]
        await pool.refresh()
        assert [e["url"] for e in pool.summary()] == [second]
    finally:
        await pool.close()
        await redis.aclose()
    # And the real resolver: a name gives one endpoint per address.
    assert f"127.0.0.1:{second.rsplit(':', 1)[1]}" in await resolve_all("localhost", int(second.rsplit(":", 1)[1]))

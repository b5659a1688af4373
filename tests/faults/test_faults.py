"""Fault injection on real processes, under steady load, counting every task that got 202.

The tests share one stack and run in order; each ends with the stack healthy again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import aiohttp

from brimful.stack import EmbeddedStack
from tests.helpers.metrics import metric_values, scrape
from tests.helpers.pipeline import expected_outputs, read_dead_letters
from tests.helpers.polling import wait_for
from tests.helpers.stacks import MAX_BACKLOG
from tests.helpers.task_client import TaskClient


@dataclass
class SteadyLoad:
    """Submits at a steady rate; remembers every accepted task and counts refusals."""

    client: TaskClient
    rate_per_s: float = 40.0
    accepted: dict[str, str] = field(default_factory=dict)
    refused: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def _one(self, text: str) -> None:
        try:
            status, body = await self.client.request(
                "POST", "/v1/tasks", json={"inputs": {"TEXT": text}}, timeout=aiohttp.ClientTimeout(total=30)
            )
        except (TimeoutError, aiohttp.ClientError):
            self.refused += 1
            return
        if status == 202:
            self.accepted[body["task_id"]] = text
        else:
            assert status == 503, body  # refusing is fine; anything else is not
            self.refused += 1

    async def _run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        while not self._stop.is_set():
            task = asyncio.create_task(self._one(f"steady {uuid.uuid4().hex[:8]} ✓"))
            pending.add(task)
            task.add_done_callback(pending.discard)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=1 / self.rate_per_s)
            except TimeoutError:
                pass
        await asyncio.gather(*pending)

    def start(self) -> SteadyLoad:
        self._task = asyncio.create_task(self._run())
        return self

    async def accepts(self, count: int, timeout_s: float = 60) -> None:
        """Until ``count`` more tasks than now have been accepted: proof the stack takes
        work at this point (after a restart, say), not a guess at how long that takes."""
        target = len(self.accepted) + count
        await wait_for(lambda: len(self.accepted) >= target, timeout_s, f"{count} more tasks accepted", interval_s=0.05)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def all_done(self, timeout_s: float = 120) -> None:
        """Every accepted task ends done with its own result (none lost, none wrong)."""
        assert self.accepted, "the load never got a task accepted"
        try:
            results = await asyncio.gather(
                *(self.client.wait_final(t, timeout_s=timeout_s, interval_s=0.25) for t in self.accepted)
            )
        except AssertionError:
            print("STATS AT FAILURE", await self.client.stats())
            raise
        for result in results:
            assert result["status"] == "done", result
            assert result["outputs"] == expected_outputs(self.accepted[result["task_id"]])


async def test_a_call_that_hangs_past_the_timeout_is_retried_and_completes(
    fault_stack: EmbeddedStack, fault_client: TaskClient
) -> None:
    metrics_url = f"http://127.0.0.1:{fault_stack.settings.batcher_metrics_port}/metrics"
    before = await metric_values(metrics_url)
    text = f"!hang-once {uuid.uuid4().hex}"
    task = await fault_client.wait_final(await fault_client.submit({"TEXT": text}), timeout_s=60)
    assert task["status"] == "done"
    assert task["outputs"] == expected_outputs(text)
    after = await metric_values(metrics_url)
    timeouts = after.get("brimful_model_calls_total", 0) - before.get("brimful_model_calls_total", 0)
    assert timeouts >= 2, "the hung call and its retry should both be counted"


async def test_a_flood_beyond_capacity_gets_503_with_retry_after_and_every_202_completes(
    fault_stack: EmbeddedStack, fault_client: TaskClient
) -> None:
    accepted: dict[str, str] = {}
    retry_afters: list[int] = []

    async def one(index: int) -> None:
        text = f"flood {index}"
        status, body = await fault_client.request("POST", "/v1/tasks", json={"inputs": {"TEXT": text}})
        if status == 202:
            accepted[body["task_id"]] = text
        else:
            assert status == 503 and body["error"]["code"] == "overloaded", body
            assert str(MAX_BACKLOG) in body["error"]["message"]

    async def flood() -> None:
        await asyncio.gather(*(one(i) for i in range(4000)))

    # Watch the Retry-After headers the refusals carry.
    async def probe() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):
                async with session.post(
                    f"{fault_stack.api_url}/v1/tasks", json={"inputs": {"TEXT": "probe"}}
                ) as response:
                    if response.status == 503:
                        retry_afters.append(int(response.headers["Retry-After"]))
                        return
                    body = await response.json()
                    accepted[body["task_id"]] = "probe"
                await asyncio.sleep(0.05)

    await asyncio.gather(flood(), probe())
    assert retry_afters and 1 <= retry_afters[0] <= 120
    assert 0 < len(accepted) < 4100, "some requests must have been refused"
    results = await asyncio.gather(*(fault_client.wait_final(t, timeout_s=180, interval_s=0.5) for t in accepted))
    for result in results:
        assert result["status"] == "done"
        assert result["outputs"] == expected_outputs(accepted[result["task_id"]])


async def test_batcher_sigkill_mid_batch_loses_nothing(fault_stack: EmbeddedStack, fault_client: TaskClient) -> None:
    before = await fault_client.stats()
    load = SteadyLoad(fault_client).start()
    await wait_for(lambda: _any_in_flight(fault_client), 20, "a batch in flight")
    name = next(n for n in fault_stack.processes if n.startswith("batcher"))
    fault_stack.processes.pop(name).kill()
    fault_stack.start_batcher()
    await asyncio.to_thread(fault_stack.wait_for_batchers)
    await load.accepts(40)  # the new batcher takes work, and computes it (all_done)
    await load.stop()
    await load.all_done()
    after = await fault_client.stats()
    rows = after["rows_dispatched"] - before["rows_dispatched"]
    duplicates = rows - len(load.accepted)
    print(
        f"\nbatcher SIGKILL: {len(load.accepted)} accepted, {rows} rows sent to the model, "
        f"{duplicates} duplicated by redelivery"
    )
    # Redelivery runs again only what was at the model when the batcher died: never more
    # than its batches in flight could hold (finished tasks are skipped by the store).
    assert duplicates <= fault_stack.settings.max_in_flight * 64, duplicates


async def lag_seconds_above(stack: EmbeddedStack, seconds: float) -> bool:
    samples = await scrape(f"http://127.0.0.1:{stack.settings.batcher_metrics_port}/metrics")
    return max((v for (name, _), v in samples.items() if name == "brimful_consumer_lag_seconds"), default=0) > seconds


async def _any_in_flight(client: TaskClient) -> bool:
    return any(batcher["in_flight"] > 0 for batcher in (await client.stats())["batchers"])


async def test_model_outage_of_20s_pauses_consumption_and_fails_nothing(
    fault_stack: EmbeddedStack, fault_client: TaskClient
) -> None:
    before = await fault_client.stats()
    load = SteadyLoad(fault_client, rate_per_s=20).start()
    await load.accepts(10)
    fault_stack.processes["triton"].kill()
    killed_at = time.monotonic()

    async def paused() -> bool:
        return any(b.get("paused_for_outage") for b in (await fault_client.stats())["batchers"])

    await wait_for(paused, 15, "the batcher to pause consumption")
    # The API stays ready: tasks queue in the broker while the model is away.
    status, readiness = await fault_client.request("GET", "/readyz")
    assert status == 200, readiness
    assert readiness["checks"]["model"] is False
    # On-call sees why: the circuit open, and the work waiting, in time.
    batcher_metrics = await scrape(f"http://127.0.0.1:{fault_stack.settings.batcher_metrics_port}/metrics")
    assert max(v for (name, _), v in batcher_metrics.items() if name == "brimful_endpoint_breaker_state") == 2
    await wait_for(lambda: lag_seconds_above(fault_stack, 1.0), 15, "the lag in seconds to show the outage")
    # The outage itself: 20 s with the model down, load still arriving.
    await asyncio.sleep(max(0.0, 20 - (time.monotonic() - killed_at)))
    during = await fault_client.stats()
    await asyncio.to_thread(fault_stack.start_model_host)

    async def resumed() -> bool:
        return not await paused()

    await wait_for(resumed, 30, "consumption to resume")
    await load.stop()
    await load.all_done(timeout_s=180)
    after = await fault_client.stats()
    assert after["tasks_failed"] == before["tasks_failed"], "the outage failed tasks"
    letters = {letter.request.task_id for letter in await read_dead_letters(fault_stack)}
    assert not letters & set(load.accepted), "the outage sent tasks to the DLQ"
    failed_calls = during["calls_failed"] - before["calls_failed"]
    print(f"\nmodel outage: {len(load.accepted)} accepted, {failed_calls} failed calls in 20 s while paused")
    assert failed_calls < 100, "retries kept burning while the model was down"


async def test_redis_restart_with_aof_loses_nothing(fault_stack: EmbeddedStack, fault_client: TaskClient) -> None:
    load = SteadyLoad(fault_client).start()
    await load.accepts(40)
    fault_stack.processes["redis"].kill()
    await asyncio.sleep(1)  # the outage: a second without Redis, the load still arriving
    await asyncio.to_thread(fault_stack.start_redis)
    await load.accepts(40)  # accepted again after the restart, and computed (all_done)
    await load.stop()
    await load.all_done()


async def test_broker_restart_on_s3_storage_loses_nothing(fault_stack: EmbeddedStack, fault_client: TaskClient) -> None:
    load = SteadyLoad(fault_client).start()
    await load.accepts(40)
    fault_stack.processes["broker"].kill()
    await asyncio.sleep(1)  # the outage: a second without the broker, the load still arriving
    await asyncio.to_thread(fault_stack.start_broker)
    await asyncio.to_thread(fault_stack.wait_for_batchers)
    await load.accepts(40)  # accepted again after the restart, and computed (all_done)
    await load.stop()
    await load.all_done(timeout_s=180)

"""Rotating requests topics in the production shape: two models, two batchers each on
four partitions, two API workers, two endpoints. Tasks cross several generations (with
identical inputs and failing rows, and a batcher killed and started again between them);
every accepted task ends right, each finished generation's topic is deleted from the
broker and never comes back, and the backlog the API admits by comes back to zero. A
batcher started again beside a live one joins no older generation while its peer holds
it; one started after every batcher of its model died takes the generations they left
with records waiting."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from brimful.commands.up import REFERENCE_MODELS
from brimful.core.kafka import connection_options
from brimful.stack import EmbeddedStack
from tests.helpers.metrics import metric_values
from tests.helpers.polling import wait_for
from tests.helpers.stacks import add_second_batchers, start_wide_stack
from tests.helpers.task_client import TaskClient

MODELS = REFERENCE_MODELS.split(",")
PERIOD_S = 5.0
GRACE_S = 15.0  # the least the settings allow with a 5 s request timeout
TRAFFIC_S = 4 * PERIOD_S


@pytest.fixture(scope="module")
def rotating_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    stack = start_wide_stack(
        tmp_path_factory.mktemp("topic-rotation"),
        models=REFERENCE_MODELS,
        api_workers=2,
        topic_rotation_s=PERIOD_S,
        topic_rotation_grace_s=GRACE_S,
        kafka_request_timeout_ms=5000,
        kafka_fetch_lagging_max_wait_ms=2500,  # at most half the request timeout
        retry_backoff_ms=50.0,
    )
    try:
        add_second_batchers(stack, MODELS)
        yield stack
    finally:
        stack.stop()


async def topics(stack: EmbeddedStack) -> set[str]:
    admin = AIOKafkaAdminClient(**connection_options(stack.settings))
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def logged_at(
    stack: EmbeddedStack, batcher: str, model: str, message: str, after_byte: int = 0
) -> list[tuple[int, str]]:
    """The generations of ``model`` a batcher's log names with ``message`` past
    ``after_byte`` (a batcher started again appends to its log), each with its line's
    time (ISO 8601 in UTC, so they compare as strings)."""
    generations = stack.settings.topic_generations_for(model)
    log_path = stack.processes[batcher].log_path
    assert log_path is not None
    with open(log_path, "rb") as log:
        log.seek(after_byte)
        lines = log.read().decode("utf-8", errors="replace").splitlines()
    named = []
    for line in lines:
        if message in line:
            entry = json.loads(line)
            number = generations.generation_of(entry["topic"])
            assert number is not None, line
            named.append((number, entry["ts"]))
    return named


def logged_generations(stack: EmbeddedStack, batcher: str, model: str, message: str, after_byte: int = 0) -> list[int]:
    return [number for number, _ in logged_at(stack, batcher, model, message, after_byte)]


def joined_generations(stack: EmbeddedStack, batcher: str, model: str, after_byte: int = 0) -> list[int]:
    return logged_generations(stack, batcher, model, "joined a topic generation", after_byte)


def held_generations(stack: EmbeddedStack, batcher: str, model: str) -> set[int]:
    """The generations a running batcher has joined and not yet retired."""
    retired = logged_generations(stack, batcher, model, "retiring a topic generation")
    return set(joined_generations(stack, batcher, model)) - set(retired)


def log_size(stack: EmbeddedStack, name: str) -> int:
    path = stack.processes[name].log_path
    return path.stat().st_size if path.exists() else 0


class TopicWatch:
    """The broker's topics, listed twice a second: those seen and then gone (``deleted``),
    and those of them seen again after (``back``)."""

    def __init__(self) -> None:
        self.deleted: set[str] = set()
        self.back: set[str] = set()

    async def run(self, stack: EmbeddedStack) -> None:
        seen: set[str] = set()
        while True:
            now = await topics(stack)
            self.back |= self.deleted & now
            self.deleted |= seen - now
            seen |= now
            await asyncio.sleep(0.5)


async def test_tasks_cross_generations_and_finished_generations_are_deleted(rotating_stack: EmbeddedStack) -> None:
    stack = rotating_stack
    settings = stack.settings
    tag = uuid.uuid4().hex[:8]
    accepted: dict[str, str] = {}  # task id -> the status it must end in
    generations_used: set[str] = set()
    first = {model: settings.topic_generations_for(model).generation_at(time.time()) for model in MODELS}
    watch = TopicWatch()
    watching = asyncio.create_task(watch.run(stack))
    async with TaskClient(stack.api_url) as client:
        started = time.monotonic()
        killed = False
        n = 0
        while time.monotonic() - started < TRAFFIC_S:
            if not killed and time.monotonic() - started > TRAFFIC_S / 2:
                victim = next(name for name in stack.processes if name.startswith("batcher"))
                stack.processes[victim].kill()  # no goodbye: its partitions move after the session timeout
                victim_log_at = log_size(stack, victim)
                victim_model = stack.batcher_model(victim)
                peer = next(
                    name
                    for name in stack.processes
                    if name.startswith("batcher") and name != victim and stack.batcher_model(name) == victim_model
                )
                current_at_restart = settings.topic_generations_for(victim_model).generation_at(time.time())
                held_by_peer = {n for n in held_generations(stack, peer, victim_model) if n < current_at_restart}
                await asyncio.to_thread(stack.start_batcher, victim)
                killed = True
            batch = []
            for k in range(20):
                n += 1
                text = f"!fail {tag} {n}" if n % 97 == 0 else f"same {k % 5}" if k % 2 else f"rotating {tag} {n}"
                batch.append({"inputs": {"TEXT": text}, "model": MODELS[n % 2]})
            status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": batch})
            assert status == 200, body
            for task, result in zip(batch, body["results"]):
                assert "task_id" in result, result
                accepted[result["task_id"]] = "failed" if task["inputs"]["TEXT"].startswith("!fail") else "done"
            for model in MODELS:
                generations_used.add(settings.topic_generations_for(model).topic_at(time.time()))
            await asyncio.sleep(0.05)
        assert killed
        assert len(generations_used) >= 2 * 4, generations_used  # the traffic crossed generations of both models
        # Its model's other batcher held these older generations: a join of one while it
        # did would only have been a rebalance of that batcher's group. It leaves them
        # soon after their end where it is not their keeper; one the victim was keeper of
        # is an orphan from then on, for either batcher to take. (Those only the victim
        # held were orphans at once.)
        joined = logged_at(stack, victim, victim_model, "joined a topic generation", victim_log_at)
        peer_left = dict(logged_at(stack, peer, victim_model, "retiring a topic generation"))
        assert held_by_peer, "the peer held no older generation when the victim started again"
        taken_from_peer = [
            (number, at)
            for number, at in joined
            if number in held_by_peer and not (number in peer_left and peer_left[number] < at)
        ]
        assert joined and not taken_from_peer, (joined, held_by_peer, peer_left)

        ends = await asyncio.gather(*(client.wait_final(task_id, timeout_s=90) for task_id in accepted))
        wrong = [(task_id, end["status"]) for task_id, end in zip(accepted, ends) if end["status"] != accepted[task_id]]
        assert not wrong, wrong[:10]

        async def old_generations_deleted() -> bool:
            now = time.time()
            left = set()
            for model in MODELS:
                generations = settings.topic_generations_for(model)
                for topic in await topics(stack):
                    number = generations.generation_of(topic)
                    if number is not None and number <= first[model] + 1 and generations.may_retire(number, now - 5):
                        left.add(topic)
            return not left

        # Retired once past their grace; the last member leaves the group, then deletes.
        await wait_for(old_generations_deleted, GRACE_S + 60, "the finished generations' topics to be deleted", 1.0)

        # A deleted generation stays deleted while sends go on to new ones (watched all
        # along by ``watch``). An API worker's producer asks for the metadata of every topic
        # it tracks each time it meets a new one, and this broker creates a topic it is asked
        # about: tracking every generation it had sent to, it brought each deleted one back,
        # to be joined and deleted again, more of them every period.
        later: list[str] = []
        started = time.monotonic()
        while time.monotonic() - started < 4 * PERIOD_S:  # each worker meets new generations
            batch = [{"inputs": {"TEXT": f"later {tag} {k}"}, "model": MODELS[k % 2]} for k in range(10)]
            status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": batch})
            assert status == 200, body
            later += [result["task_id"] for result in body["results"]]
            await asyncio.sleep(0.25)
        ends = await asyncio.gather(*(client.wait_final(task_id, timeout_s=90) for task_id in later))
        assert all(end["status"] == "done" for end in ends), [end for end in ends if end["status"] != "done"][:5]
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        assert watch.deleted, "no generation was seen deleted"
        assert not watch.back, f"deleted generations created again: {sorted(watch.back)}"

        async def backlog_drained() -> bool:
            # The retired generations' lag is forgotten, not left standing in admission.
            return (await metric_values(f"{stack.api_url}/metrics")).get("brimful_backlog_rows", -1) == 0

        await wait_for(backlog_drained, 30, "the backlog to come back to zero")


async def test_generations_left_with_records_by_every_batcher_of_a_model_are_taken_by_one_started_after(
    rotating_stack: EmbeddedStack,
) -> None:
    stack = rotating_stack
    model = MODELS[1]
    generations = stack.settings.topic_generations_for(model)
    batchers = [name for name in stack.processes if name.startswith("batcher") and stack.batcher_model(name) == model]
    assert len(batchers) == 2
    for name in batchers:
        stack.processes[name].kill()
    tag = uuid.uuid4().hex[:8]
    accepted: dict[str, str] = {}
    left_in: set[int] = set()
    async with TaskClient(stack.api_url) as client:
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < 1.5 * PERIOD_S:  # into two generations at least
            batch = []
            for k in range(10):
                n += 1
                text = f"!fail {tag} {n}" if n % 23 == 0 else f"same {k % 3}" if k % 2 else f"orphaned {tag} {n}"
                batch.append({"inputs": {"TEXT": text}, "model": MODELS[n % 2]})
            left_in.add(generations.generation_at(time.time()))
            status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": batch})
            assert status == 200, body
            for task, result in zip(batch, body["results"]):
                accepted[result["task_id"]] = "failed" if task["inputs"]["TEXT"].startswith("!fail") else "done"
            await asyncio.sleep(0.1)
        # Once sends have moved past them, those generations are older ones with no live batcher.
        await asyncio.sleep(max(0.0, generations.ends_at(max(left_in)) - time.time()) + 0.5)
        survivor = batchers[0]
        log_at = log_size(stack, survivor)
        await asyncio.to_thread(stack.start_batcher, survivor)
        ends = await asyncio.gather(*(client.wait_final(task_id, timeout_s=90) for task_id in accepted))
    wrong = [(task_id, end["status"]) for task_id, end in zip(accepted, ends) if end["status"] != accepted[task_id]]
    assert not wrong, wrong[:10]
    assert left_in <= set(joined_generations(stack, survivor, model, log_at)), left_in
    await asyncio.to_thread(stack.start_batcher, batchers[1])  # the module's last test counts four


async def test_a_broker_away_when_a_generation_is_joined_leaves_every_batcher_running(
    rotating_stack: EmbeddedStack,
) -> None:
    # Last in the module: the broker here keeps its records in memory, so its restart
    # empties it. With rotation a batcher joins a new generation every period, and a
    # consumer cannot start while the broker is away: each batcher of the soak's first
    # broker restart with rotation on ended there (bench/results/reliability-log.md).
    stack = rotating_stack
    generations = stack.settings.topic_generations_for(MODELS[0])
    batchers = [name for name in stack.processes if name.startswith("batcher")]
    assert len(batchers) == 4  # two of each model
    now = time.time()
    # The next generation is joined lead_s before its start: down from before that, until
    # a turn or two of the batchers' (one a second) have met it.
    joined_at = generations.ends_at(generations.generation_at(now)) - generations.lead_s
    if joined_at - now < 1.0:
        joined_at += generations.period_s
    stack.processes["broker"].kill()
    await asyncio.sleep(joined_at - time.time() + 2.5)  # the fault's length: across the join
    await asyncio.to_thread(stack.restart, "broker")
    await asyncio.to_thread(stack.wait_for_batchers)
    assert [name for name in batchers if not stack.processes[name].running()] == []
    tag = uuid.uuid4().hex[:8]
    async with TaskClient(stack.api_url) as client:
        batch = [{"inputs": {"TEXT": f"after {tag} {k % 7}"}, "model": MODELS[k % 2]} for k in range(40)]
        status, body = await client.request("POST", "/v1/tasks:batch", json={"tasks": batch})
        assert status == 200, body
        ends = await asyncio.gather(*(client.wait_final(result["task_id"], timeout_s=60) for result in body["results"]))
    assert [end["status"] for end in ends] == ["done"] * len(batch)
    assert [name for name in batchers if not stack.processes[name].running()] == []

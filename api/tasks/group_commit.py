"""Group commit: submissions that arrive together share their I/O.

While one group is being recorded in Redis, the submissions that arrive meanwhile wait
and form the next group. A lone submission goes at once, and groups grow only with load.
While a group's records are out at the broker unanswered
(``submit_groups_unacknowledged``, default one), the next group waits for that answer, so
with arrivals spread groups grow with the broker's answer time, not with how close
together the submissions came; with a gap set (``submit_group_gap_ms``), a group that
follows another within it also waits for the rest of the gap. A group costs one
Redis round trip (one script call records every task and checks every in-flight limit;
on a cluster, one pipeline, and a second round trip only to take refused records back),
and its records reach the producer together, which sends them in one request per broker
(one record batch: groups stay on one partition while a request is out). The
acknowledgements are awaited beside the next group's Redis work.

The durability contract is the one-at-a-time path's: each task is recorded before its
record can reach a batcher, and each submission is answered when its own record is
acknowledged (acks=all). A recorded task stays in Redis's set of unconfirmed tasks until
the broker has answered for it (``SubmissionReceipts``, below), so one whose API is
killed in between does not hold its tenant's quota. A failure reaches exactly the
submissions it concerns: a Redis error, the group whose round trip failed (or the one task
whose own key failed); a refused send, the records the broker refused, each of them taken
back out of Redis before its caller hears of it.

``SubmissionReceipts`` writes the broker's answers for recorded tasks back to Redis, and
sweeps the tasks whose API stopped before it heard one. Admission puts every task it
records in the set of unconfirmed tasks (``core/admission.py``). Once the broker has answered for a task, accepted or
refused, its entry goes. The accepted ones are taken out in bulk about once a second
(``CONFIRM_EVERY_S``), so confirming costs no round trip a group: one a second,
whatever the load. The refused ones go as they are taken back.

Every API also sweeps the set: an entry older than the longest a submission can take,
plus the confirmation's delay, was left by an API that stopped between recording a task
and confirming it (killed, or its node lost), or its confirmation was lost (a Redis that
lost its last second). Its task is taken out of its tenant's in-flight count, so a crash
costs the tenant no quota; a task that was accepted only leaves the count early."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from redis.exceptions import RedisError

from brimful.core import metrics
from brimful.core.admission import COMMAND_MEMBERS, UnconfirmedTasks, unconfirmed_member
from brimful.core.settings import Settings
from brimful.core.task_record import NewTask
from brimful.core.task_store import TaskStore
from brimful.core.topic_generations import TopicGenerations

log = logging.getLogger("brimful.api")


class InFlightLimitReached(Exception):
    """The tenant already has its limit of unfinished tasks (``count`` of them)."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} tasks in flight")
        self.count = count


class GroupCommitterFull(Exception):
    """More submissions wait for a group than the committer holds."""


class GroupCommitterStopped(Exception):
    """The API stopped before the submission was confirmed."""


@dataclass
class _Submission:
    task: NewTask
    record: bytes
    outcome: asyncio.Future[RecordMetadata] = field(repr=False)
    headers: list[tuple[str, bytes]] | None = None  # the task's trace context, when traced

    def settle(self, result: RecordMetadata | None = None, error: BaseException | None = None) -> None:
        if self.outcome.done():  # nobody waits any more (a cancelled request): nothing to tell
            return
        if error is not None:
            self.outcome.set_exception(error)
        else:
            self.outcome.set_result(result)


def _consume_error(outcome: asyncio.Future[RecordMetadata]) -> None:
    # The caller may have gone (cancelled); its outcome's error is then read here, not lost
    # to asyncio's "exception was never retrieved".
    if not outcome.cancelled():
        outcome.exception()


class GroupCommitter:
    """Records tasks in Redis and sends them to the requests topic, a group at a time."""

    def __init__(
        self,
        store: TaskStore,
        producer: AIOKafkaProducer,
        generations: TopicGenerations,
        max_group: int,
        max_waiting: int,
        receipts: SubmissionReceipts,
        min_gap_s: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
        max_unacknowledged: int = 0,
    ) -> None:
        """``generations``: the model's requests topic, whose generation of the moment on
        ``wall_clock`` a group goes to (it changes where topics rotate); ``receipts``: where
        the tasks the broker accepted are confirmed; ``min_gap_s``: least time between the
        starts of two groups (0: none); ``max_unacknowledged``: most groups sent and not yet
        answered by the broker, past which the next waits (0: no bound)."""
        self._store = store
        self.producer = producer  # the API sets its new one while the broker is awaited
        self._generations = generations
        self._wall_clock = wall_clock
        self._max_group = max_group
        self._max_waiting = max_waiting
        self._min_gap_s = min_gap_s
        self._max_unacknowledged = max_unacknowledged
        self.receipts = receipts  # where the tasks the broker accepted are confirmed
        self._last_group_at = float("-inf")  # loop time the last group began
        self._waiting: deque[_Submission] = deque()
        self._runner: asyncio.Task[None] | None = None
        self._acks: set[asyncio.Task[None]] = set()
        self._closed = False
        # The partition groups go to now, and whether the next group takes the next one:
        # groups stay on one partition until a produce request comes back (see _next_partition).
        self._turn = 0
        self._turn_over = True
        # Recorded in Redis, not yet acknowledged or refused (task id -> tenant): what a stop
        # cut short withdraws, rather than leave them queued for the waiting TTL.
        self._unconfirmed: dict[str, str] = {}

    async def submit(
        self, task: NewTask, record: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> RecordMetadata:
        """Record ``task`` as queued and put ``record`` on the requests topic, with the
        submissions that arrive alongside. Returns where the record landed. Raises
        InFlightLimitReached, GroupCommitterFull, GroupCommitterStopped, RedisError (the
        task was not recorded) or KafkaError (the record was not acknowledged, and the task
        is taken back)."""
        if self._closed:
            raise GroupCommitterStopped("the API is stopping")
        if len(self._waiting) >= self._max_waiting:
            raise GroupCommitterFull(f"{len(self._waiting)} submissions are waiting to be written")
        outcome: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_consume_error)
        self._waiting.append(_Submission(task, record, outcome, headers))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="group-commit")
        # Shielded: a caller that goes away leaves its submission to finish with its group.
        return await asyncio.shield(outcome)

    async def close(self, drain_s: float, withdraw_s: float = 2.0) -> None:
        """Stop taking submissions and let those under way finish, up to ``drain_s``; one
        still unwritten then is answered with GroupCommitterStopped, never left hanging,
        and one recorded but not acknowledged is withdrawn (within ``withdraw_s``): its
        caller heard it was not accepted, so it must neither run nor count in flight."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        while under_way := [task for task in [self._runner, *self._acks] if task is not None and not task.done()]:
            # Again after each wait: the runner starts a settling task for each group it writes.
            left_s = deadline - loop.time()
            if left_s <= 0:
                for task in under_way:
                    task.cancel()
                await asyncio.gather(*under_way, return_exceptions=True)
                break
            await asyncio.wait(under_way, timeout=left_s)
        while self._waiting:
            self._waiting.popleft().settle(error=GroupCommitterStopped("the API is stopping"))
        if self._unconfirmed:
            cut_short = list(self._unconfirmed.items())
            try:
                await asyncio.wait_for(self._store.withdraw_many(cut_short), withdraw_s)
                self._unconfirmed.clear()
            except (TimeoutError, RedisError) as error:
                log.error(
                    "could not withdraw tasks a stop cut short; they stay queued until their records expire",
                    extra={"tasks": len(cut_short), "error": str(error)},
                )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            # Only a group following another within the gap waits: the rest of its gap
            # gathers the submissions arriving meanwhile into it.
            if (pause_s := self._last_group_at + self._min_gap_s - loop.time()) > 0:
                await asyncio.sleep(pause_s)
            await self._until_answered()
            self._last_group_at = loop.time()
            group = [self._waiting.popleft() for _ in range(min(self._max_group, len(self._waiting)))]
            metrics.SUBMIT_GROUP_SIZE.observe(len(group))
            try:
                await self._commit(group)
            except Exception as error:  # a bug must not leave callers waiting forever
                log.exception("group commit failed")
                for submission in group:
                    submission.settle(error=error)
            except BaseException as error:  # cancelled: whoever waits hears it
                for submission in group:
                    submission.settle(error=GroupCommitterStopped(f"the API is stopping ({type(error).__name__})"))
                raise

    async def _until_answered(self) -> None:
        """Until fewer than ``max_unacknowledged`` groups are out at the broker: the
        submissions arriving meanwhile join the next group. Bounded by the broker's
        request timeout, after which every send out is answered, refused or not."""
        if not self._max_unacknowledged:
            return
        while len(out := [task for task in self._acks if not task.done()]) >= self._max_unacknowledged:
            await asyncio.wait(out, return_when=asyncio.FIRST_COMPLETED)

    async def _commit(self, group: list[_Submission]) -> None:
        try:
            outcomes = await self._store.create_queued_many([submission.task for submission in group])
        except RedisError as error:
            for submission in group:
                submission.settle(error=error)
            return
        producer = self.producer
        topic = self._generations.topic_at(self._wall_clock())  # one topic a group: chosen as it is sent
        partition = await self._next_partition(producer, topic)
        sent: list[tuple[_Submission, asyncio.Future[RecordMetadata]]] = []
        refused: list[tuple[_Submission, KafkaError]] = []
        for submission, outcome in zip(group, outcomes):
            if isinstance(outcome, RedisError):  # a command of its own failed; the others go on
                submission.settle(error=outcome)
                continue
            if outcome is not None:
                submission.settle(error=InFlightLimitReached(outcome))
                continue
            self._unconfirmed[submission.task.task_id] = submission.task.tenant
            try:
                # Queues the record and returns at once (or once the producer has room).
                ack = await producer.send(
                    topic,
                    value=submission.record,
                    key=submission.task.task_id.encode(),
                    partition=partition,
                    headers=submission.headers,
                )
            except KafkaError as error:
                refused.append((submission, error))
                continue
            sent.append((submission, ack))
        settling = asyncio.create_task(self._settle(sent, refused), name="group-commit-acks")
        self._acks.add(settling)
        settling.add_done_callback(self._acks.discard)

    async def _next_partition(self, producer: AIOKafkaProducer, topic: str) -> int | None:
        """The partition for the next group's records, the partitions in turn, the next one
        taken only after a produce request has come back (a sticky partitioner). The producer
        keeps one request in flight to a broker and gathers what is sent meanwhile, so the
        groups that arrive while a request is out all join one record batch of one
        partition; turning the partition each group would split that gathering into a batch
        per partition, and the broker's cost follows its record batches, not its records.
        No key hashing a record either (aiokafka hashes in Python); the task ids are random,
        so hashing them spread nothing better. None (hash the keys) while the producer knows
        no partitions yet."""
        try:
            partitions = await producer.partitions_for(topic)
        except KafkaError:
            return None
        if not partitions:
            return None
        if self._turn_over:
            self._turn += 1
            self._turn_over = False
        return int(sorted(partitions)[self._turn % len(partitions)])

    async def _settle(
        self,
        sent: list[tuple[_Submission, asyncio.Future[RecordMetadata]]],
        refused: list[tuple[_Submission, KafkaError]],
    ) -> None:
        """Answer each submission from its own acknowledgement."""
        try:
            answers = await asyncio.gather(*(ack for _, ack in sent), return_exceptions=True)
        except BaseException as error:  # cancelled while stopping: whoever waits hears it
            for submission, _ in [*sent, *refused]:
                submission.settle(error=GroupCommitterStopped(f"the API is stopping ({type(error).__name__})"))
            raise
        finally:
            self._turn_over = True  # a request came back: what is sent next starts a new batch
        accepted: list[tuple[_Submission, RecordMetadata]] = []
        for (submission, _), answer in zip(sent, answers):
            if isinstance(answer, KafkaError):
                refused.append((submission, answer))
            elif isinstance(answer, BaseException):
                refused.append((submission, KafkaError(str(answer))))
            else:
                accepted.append((submission, answer))
        if refused:
            # Taken back before anyone hears "not accepted", so a retry never meets it.
            try:
                await self._store.withdraw_many([(s.task.task_id, s.task.tenant) for s, _ in refused])
            except RedisError as error:
                log.error("could not take back tasks the broker refused; they expire", extra={"error": str(error)})
        for submission, _ in [*accepted, *refused]:
            self._unconfirmed.pop(submission.task.task_id, None)
        self.receipts.confirmed((s.task.task_id, s.task.tenant) for s, _ in accepted)
        for submission, refusal in refused:
            submission.settle(error=refusal)
        for submission, metadata in accepted:
            submission.settle(result=metadata)


# How often accepted tasks' entries are taken out of the set: a round trip a second.
CONFIRM_EVERY_S = 1.0
# Confirmations kept while Redis cannot take them: past this, the oldest are dropped, and
# the sweep later takes their tasks out of the in-flight count (early, a small undercount).
MAX_PENDING = 100_000
# A sweep every this share of the time an entry takes to turn stale.
SWEEP_EVERY_SHARE = 0.5
# Most calls one sweep makes (COMMAND_MEMBERS entries each): the rest wait for the next.
SWEEP_MAX_CALLS = 10
# Task ids a sweep's log line names at most.
LOGGED_IDS = 20


def longest_submission_s(settings: Settings) -> float:
    """Longer than any submission can take from its record in Redis to its answer: the
    broker's timeout and Redis's pool wait, twice, and 5 s."""
    return 2 * (settings.kafka_request_timeout_ms / 1000 + settings.redis_pool_timeout_s) + 5


def stale_after_s(longest_s: float) -> float:
    """An entry older than this is stale: its API would have confirmed it by now (the
    longest submission, ``longest_s``, and the confirmation's delay)."""
    return longest_s + 2 * CONFIRM_EVERY_S


def released_within_s(settings: Settings) -> float:
    """At most how long after its record a task left unconfirmed leaves its tenant's
    in-flight count: stale, then swept within a sweep's period."""
    return stale_after_s(longest_submission_s(settings)) * (1 + SWEEP_EVERY_SHARE)


class SubmissionReceipts:
    """Confirms accepted tasks in bulk, and sweeps those no API will confirm."""

    def __init__(
        self,
        unconfirmed: UnconfirmedTasks,
        longest_submission_s: float,
        wall_s: Callable[[], float] = time.time,
    ) -> None:
        self._unconfirmed = unconfirmed
        self.stale_after_s = stale_after_s(longest_submission_s)
        self.sweep_every_s = SWEEP_EVERY_SHARE * self.stale_after_s
        self._wall_s = wall_s
        self._pending: deque[str] = deque(maxlen=MAX_PENDING)

    def confirmed(self, tasks: Iterable[tuple[str, str]]) -> None:
        """(task id, tenant) of tasks the broker accepted: their entries go at the next flush."""
        self._pending.extend(unconfirmed_member(task_id, tenant) for task_id, tenant in tasks)

    @property
    def pending(self) -> int:
        """Confirmations not yet written."""
        return len(self._pending)

    async def flush(self) -> None:
        """Write the confirmations noted so far; kept for the next flush if Redis fails."""
        if not self._pending:
            return
        members = list(self._pending)
        self._pending.clear()
        try:
            await self._unconfirmed.confirm(members)
        except RedisError as error:
            log.warning("could not confirm submissions; will retry", extra={"tasks": len(members), "error": str(error)})
            self._pending.extendleft(reversed(members))

    async def sweep(self) -> list[tuple[str, str]]:
        """Release the stale entries' tasks from their tenants' in-flight counts; returns
        their (task id, tenant)."""
        cutoff_ms = int(1000 * (self._wall_s() - self.stale_after_s))
        released: list[tuple[str, str]] = []
        for _ in range(SWEEP_MAX_CALLS):
            tasks = await self._unconfirmed.release_stale(cutoff_ms)
            released += tasks
            if len(tasks) < COMMAND_MEMBERS:
                break
        if released:
            metrics.UNCONFIRMED_RELEASED.inc(len(released))
            log.warning(
                "released tasks never confirmed from the in-flight count (an API stopped before it confirmed "
                "them, or Redis lost the confirmation); each runs if its record reached the broker",
                extra={"tasks": len(released), "task_ids": [task_id for task_id, _ in released[:LOGGED_IDS]]},
            )
        return released

    async def run(self) -> None:
        """Flush every CONFIRM_EVERY_S and sweep every ``sweep_every_s``, until cancelled."""
        next_sweep = time.monotonic()  # at once: what a stop long past left is stale already
        while True:
            await self.flush()
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.sweep_every_s
                try:
                    await self.sweep()
                except RedisError as error:
                    log.warning("could not sweep unconfirmed submissions", extra={"error": str(error)})
            await asyncio.sleep(CONFIRM_EVERY_S)

"""Driving batch jobs: every API worker runs ``BatchJobs.run``, and each job is driven by
one worker at a time, the one holding its lease in Redis; when that worker stops, another
takes the job over where its last checkpoint left it.

A job's input file is read twice, a line at a time: once to count it (``validating``: a
file that is gone, empty or too long fails the job), once to run it (``in_progress``), each
line checked as it is read (a bad one goes to the error file). Each line becomes
low-priority tasks of the job's tenant, submitted as earlier ones finish (at most
``batch_job_window`` unfinished) under an Idempotency-Key of its own, so a takeover never
submits a line twice. ``api/jobs/job_results.py`` writes what finished and, at the end
(``finalizing``), the output and error files. A cancel or the end of the completion window
stops the submitting: tasks not yet dispatched are cancelled, running ones finish, and the
lines that never ran go to the error file with ``batch_cancelled`` or ``batch_expired``. An
input file deleted while its job runs ends the job the same way, ``failed``: the lines that
finished stay in its files, the lines never read are counted failed, and its errors say why.

Every step is bounded: lines submitted a step, the time of a step, the lines read ahead, the
time of one look over the jobs. Each look takes every active job, one tenant's at a time in
turn (``core/batch_job_turns.py``), so one tenant's jobs never hold back another's; a job
refused for now (429, 503) gives its lines back to its reader, never reading its input again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from brimful.api.http.bodies import ApiError
from brimful.api.http.guards import Principal
from brimful.api.jobs.job_lines import (
    MAX_LINE_BYTES,
    BatchLine,
    InputCheck,
    LineError,
    custom_id_of,
    duplicate,
    non_blank,
    parse_line,
)
from brimful.api.jobs.job_results import BatchResults, StepLines
from brimful.api.openai.embedding_answer import EmbeddingShape
from brimful.api.openai.embedding_request import EMBEDDINGS_PATH
from brimful.api.openai.token_ids import TokenVocabulary, token_vocabulary
from brimful.api.state import ApiState
from brimful.api.tasks.idempotency import claim_idempotency_key
from brimful.api.tasks.submitter import Submitter, new_task_id
from brimful.core.batch_job_turns import turns
from brimful.core.batch_records import INVALID_LINES, MAX_ACTIVE_JOBS, BatchRecord, BatchRecords
from brimful.core.batch_status import BatchStatus
from brimful.core.object_store import LineTooLong, ObjectNotFound

log = logging.getLogger("brimful.api")

TICK_S = 0.5  # how often a worker looks for jobs to drive
LEASE_S = 30.0  # a job whose driver stopped is taken over after this
STEP_S = 2.0  # the longest one job's step runs before the next job's turn
TICK_BUDGET_S = 4.0  # the longest one look runs; the next look goes on where it stopped
REFUSED_PAUSE_S = 1.0  # after a 429 or 503 on a line, its job waits this long
REFUSED_PER_STEP = 10_000  # lines a step writes off when a job ends early
SUBMIT_GROUP = 64  # lines submitted at once
YIELD_EVERY_LINES = 256  # lines checked at validating between turns of the event loop


@dataclass
class _Cursor:
    """Where this worker reads a job's input: the open line stream, and the custom ids seen."""

    lines: AsyncIterator[bytes]
    position: int = 0  # lines read so far
    seen: set[str] = field(default_factory=set)
    again: list[bytes] = field(default_factory=list)  # lines given back, read before the stream's next
    vocabulary: TokenVocabulary | None = None  # where an embeddings job's token ids are decoded

    def give_back(self, raws: list[bytes], custom_ids: list[str]) -> None:
        """Lines read but not submitted (refused for now): read again next, and their
        custom ids not seen yet, so a job waiting on a 429 never reads its input again."""
        self.again[:0] = raws
        self.position -= len(raws)
        self.seen.difference_update(custom_ids)


class BatchJobs:
    """The jobs this worker drives."""

    def __init__(self, state: ApiState, records: BatchRecords) -> None:
        self._state = state
        self._records = records
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._cursors: dict[str, _Cursor] = {}
        self._paused: dict[str, float] = {}  # job -> until when its submitting waits (after a 429 or 503)
        self._tenants: dict[str, str] = {}  # active job -> its tenant
        self._stepped_at: dict[str, float] = {}  # active job -> when this worker last stepped it
        self._results = BatchResults(state)

    async def run(self) -> None:
        """For the life of the process: each active job whose lease this worker holds, or
        can take, gets a step in turn."""
        while True:
            try:
                await self.tick()
            except (RedisError, KafkaError, OSError) as error:
                log.warning("batch jobs: a step failed; retrying", extra={"error": str(error)})
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        """One look: every active job, in turns across tenants (``core/batch_job_turns.py``),
        each whose lease this worker holds or can take stepped, until the look's time is up."""
        active = await self._records.active(MAX_ACTIVE_JOBS)
        await self._learn_tenants(active)
        deadline = time.monotonic() + TICK_BUDGET_S
        for batch_id in turns(active, self._tenants, self._stepped_at):
            if time.monotonic() >= deadline:
                return  # the next look goes on with the jobs not stepped
            if not await self._records.lease(batch_id, self._holder, LEASE_S):
                self._cursors.pop(batch_id, None)  # another worker drives it now
                self._paused.pop(batch_id, None)
                continue
            self._stepped_at[batch_id] = time.monotonic()
            try:
                async with self._lease_kept(batch_id):
                    await self._step(batch_id)
            except (RedisError, KafkaError, OSError):
                raise  # the whole tick waits for the next one
            except Exception:  # one job's bug must not stop the others: logged, tried again next tick
                log.exception("batch job step failed", extra={"batch_id": batch_id})
                self._cursors.pop(batch_id, None)

    @asynccontextmanager
    async def _lease_kept(self, batch_id: str) -> AsyncIterator[None]:
        """The job's lease renewed every third of it while a step runs, however long the step
        takes (a large file validated or joined), so no other worker takes the job midway."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(LEASE_S / 3)
                if not await self._records.lease(batch_id, self._holder, LEASE_S):
                    log.warning("batch job lease lost during a step", extra={"batch_id": batch_id})

        keeper = asyncio.create_task(renew())
        try:
            yield
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)

    async def _learn_tenants(self, active: list[str]) -> None:
        """Each active job's tenant (it never changes: read once); jobs ended are forgotten."""
        still = set(active)
        for known in (self._tenants, self._stepped_at):
            for batch_id in [batch_id for batch_id in known if batch_id not in still]:
                del known[batch_id]
        self._tenants.update(await self._records.tenants([b for b in active if b not in self._tenants]))

    async def _step(self, batch_id: str) -> None:
        record = await self._records.get(batch_id)
        if record is None or record.status.is_final:
            self._cursors.pop(batch_id, None)
            await self._records.release(batch_id, self._holder)
            return
        if not record.ending:
            if record.status is BatchStatus.CANCELLING:
                record.ending = "cancelled"
            elif time.time() >= record.expires_at:
                record.ending = "expired"
            if record.ending:
                await self._records.checkpoint(batch_id, ending=record.ending)
                log.info("batch job ending", extra={"batch_id": batch_id, "ending": record.ending})
        if record.status is BatchStatus.VALIDATING and not record.ending:
            await self._validate(record)
        elif record.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING):
            try:
                await self._run_lines(record)
            except ObjectNotFound:
                await self._input_gone(record)
        elif record.status is BatchStatus.FINALIZING:
            await self._finalize(record)

    async def _input_gone(self, record: BatchRecord) -> None:
        """The input file was deleted while the job ran: the job ends ``failed``, the way a
        cancel ends it (what waits is cancelled, what runs finishes, the lines that finished
        stay in its output and error files), and its errors say why."""
        problems = [
            {
                "code": "invalid_file",
                "message": f"the input file {record.input_file_id} was deleted while the job ran; "
                "the lines that finished are in the job's output and error files",
                "param": "input_file_id",
                "line": None,
            }
        ]
        await self._records.checkpoint(record.batch_id, ending="failed", errors=orjson.dumps(problems).decode())
        self._cursors.pop(record.batch_id, None)
        log.warning("batch job ending: its input file is gone", extra={"batch_id": record.batch_id})

    # --- validating ---------------------------------------------------------------------

    async def _validate(self, record: BatchRecord) -> None:
        """Count the input's lines, and check each where the job fails on an invalid one
        (OpenAI's way); fail the job if it cannot be read, is too long, or holds invalid
        lines, its errors listing them."""
        strict = record.invalid_lines == INVALID_LINES[0]
        if strict and (self._state.catalogue is None or not self._state.serving):
            return  # lines are checked against the models served: the next step
        check = InputCheck(
            record.endpoint, self._state.catalogue if strict else None, self._state.settings.max_bulk_tasks
        )
        check.vocabulary = await self._vocabulary(record) if strict else None
        limit = self._state.settings.batch_max_lines
        try:
            async for line in self._state.object_store.lines(record.input_file_id, MAX_LINE_BYTES):
                if line.strip():
                    check.add(line)
                if check.lines > limit:
                    await self._fail(record, "too_many_lines", f"the input file has more than {limit} lines")
                    return
                if check.lines % YIELD_EVERY_LINES == 0:
                    await asyncio.sleep(0)  # checking 50,000 lines must not hold the event loop
        except ObjectNotFound:
            await self._fail(record, "invalid_file", f"the input file {record.input_file_id} is gone")
            return
        except LineTooLong:
            await self._fail(record, "line_too_long", f"line {check.lines + 1} is longer than {MAX_LINE_BYTES} bytes")
            return
        if check.lines == 0:
            await self._fail(record, "empty_file", "the input file holds no line")
        elif check.invalid:
            await self._fail_all(record, check.errors())
        else:
            await self._records.move(
                record.batch_id, BatchStatus.IN_PROGRESS, (BatchStatus.VALIDATING,), total=check.lines
            )
            log.info("batch job validated", extra={"batch_id": record.batch_id, "lines": check.lines})

    async def _vocabulary(self, record: BatchRecord) -> TokenVocabulary | None:
        """Where an embeddings job's token ids are decoded (None: not such a job)."""
        encoding = self._state.settings.embedding_token_encoding
        return await token_vocabulary(encoding) if encoding and record.endpoint == EMBEDDINGS_PATH else None

    async def _fail(self, record: BatchRecord, code: str, message: str) -> None:
        await self._fail_all(record, [{"code": code, "message": message, "param": None, "line": None}])

    async def _fail_all(self, record: BatchRecord, problems: list[dict[str, Any]]) -> None:
        code = problems[0]["code"]
        await self._announce(dataclasses.replace(record, status=BatchStatus.FAILED, errors=problems))
        await self._records.move(record.batch_id, BatchStatus.FAILED, errors=orjson.dumps(problems).decode())
        await self._results.delete_parts(record)  # none, unless it ran: never left behind
        self._cursors.pop(record.batch_id, None)
        self._paused.pop(record.batch_id, None)
        log.warning("batch job failed", extra={"batch_id": record.batch_id, "code": code})

    async def _announce(self, ended: BatchRecord) -> None:
        """The job's end to the tenant's webhooks, before the move that records it: a step
        run again after a crash emits it again, which makes no second delivery."""
        ended.times = {**ended.times, ended.status.timestamp_field: int(time.time())}
        event_type = f"batch.{ended.status.value}"
        await self._state.webhooks.emit(ended.tenant, event_type, ended.as_openai(), f"{ended.batch_id}:{event_type}")

    # --- in progress ---------------------------------------------------------------------

    async def _run_lines(self, record: BatchRecord) -> None:
        """Collect finished lines; submit more while the window has room (or, when the job
        ends early, cancel what waits and account for the lines never run); then move on
        once every line is accounted for."""
        step = StepLines()
        pending = await self._records.pending(record.batch_id)
        running = await self._results.collect(record, pending, step)
        deadline = time.monotonic() + STEP_S
        started: dict[int, bytes] = {}
        lines_done = record.lines_done
        all_read = False
        if record.ending:
            running = await self._cancel_waiting(record, pending, step)
            lines_done, all_read = await self._refuse_rest(record, lines_done, step)
        elif record.status is BatchStatus.IN_PROGRESS:
            lines_done = await self._submit(record, lines_done, running, started, step, deadline)
            all_read = lines_done >= record.total
        await self._results.write_parts(record, step)
        await self._records.checkpoint(
            record.batch_id,
            started=started,
            finished=step.finished,
            counts={"completed": step.completed, "failed": step.failed, "input_tokens": step.input_tokens},
            lines_done=lines_done,
            # A job ended before it was counted counts what it read.
            total=max(record.total, lines_done),
            output_parts=record.output_parts + (1 if step.output else 0),
            error_parts=record.error_parts + (1 if step.errors else 0),
            **({"model": step.model} if step.model and not record.model else {}),
        )
        # Lines whose tasks a cancel just ended are written at the next step, with the rest.
        uncollected = len(pending) - len(step.finished)
        if all_read and not started and running == 0 and uncollected == 0:
            await self._records.move(record.batch_id, BatchStatus.FINALIZING)
            self._cursors.pop(record.batch_id, None)

    async def _submit(
        self,
        record: BatchRecord,
        lines_done: int,
        running: int,
        started: dict[int, bytes],
        step: StepLines,
        deadline: float,
    ) -> int:
        """Submit the next lines while the window has room and the step has time; the
        lines done after it."""
        window = self._state.settings.batch_job_window
        if self._state.catalogue is None or not self._state.serving:
            return lines_done  # not serving yet: the next step
        if time.monotonic() < self._paused.get(record.batch_id, 0.0):
            return lines_done
        cursor = await self._cursor(record, lines_done)
        principal = Principal(tenant=record.tenant, scopes=frozenset(), key_id=f"batch {record.batch_id}")
        submitter = Submitter(self._state, principal)
        while running < window and time.monotonic() < deadline and lines_done < record.total:
            # A group of lines at once: their tasks share the group commits of the API.
            size = min(SUBMIT_GROUP, window - running, record.total - lines_done)
            group, raws = await self._read_group(record, cursor, size)
            if not group:
                break
            outcomes = await asyncio.gather(
                *(
                    self._submit_line(record, line, lines_done + offset, submitter)
                    for offset, line in enumerate(group)
                    if isinstance(line, BatchLine)
                ),
                return_exceptions=True,
            )
            submitted = iter(outcomes)
            for index, line in enumerate(group):
                if isinstance(line, LineError):
                    lines_done += step.fail(line.custom_id, line.code, line.message)
                    continue
                outcome = next(submitted)
                if isinstance(outcome, ApiError) and outcome.status in (409, 429, 503):
                    # The tenant or the model is full: this line and the rest of the group
                    # again later (submitting one again finds the tasks it made: their keys).
                    rest = group[index:]
                    cursor.give_back(raws[index:], [each.custom_id for each in rest if isinstance(each, BatchLine)])
                    self._paused[record.batch_id] = time.monotonic() + REFUSED_PAUSE_S
                    return lines_done
                if isinstance(outcome, ApiError):
                    lines_done += step.fail(line.custom_id, outcome.code, outcome.message)
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                shape = EmbeddingShape.of(line.embedding) if line.embedding is not None else None
                started[lines_done] = orjson.dumps(
                    {"custom_id": line.custom_id, "task_ids": outcome, "embedding": shape.__dict__ if shape else None}
                )
                running += len(outcome)
                lines_done += 1
                step.model = step.model or line.submissions[0].model
        return lines_done

    async def _read_group(
        self, record: BatchRecord, cursor: _Cursor, size: int
    ) -> tuple[list[BatchLine | LineError], list[bytes]]:
        """Up to ``size`` next lines of the input, each parsed or its error, with their bytes."""
        group: list[BatchLine | LineError] = []
        raws: list[bytes] = []
        while len(group) < size:
            raw = await _next_line(cursor)
            if raw is None:
                break
            raws.append(raw)
            try:
                group.append(self._parse(record, raw, cursor))
            except LineError as error:
                group.append(error)
        return group, raws

    def _parse(self, record: BatchRecord, raw: bytes, cursor: _Cursor) -> BatchLine:
        assert self._state.catalogue is not None  # _submit waits for it
        catalogue, max_inputs = self._state.catalogue, self._state.settings.max_bulk_tasks
        line = parse_line(raw, record.endpoint, catalogue, max_inputs, cursor.vocabulary)
        if line.custom_id in cursor.seen:
            raise duplicate(line.custom_id)
        cursor.seen.add(line.custom_id)
        return line

    async def _submit_line(self, record: BatchRecord, line: BatchLine, number: int, submitter: Submitter) -> list[str]:
        """Submit a line's tasks, each under its own key (a space: no client's key can be
        it), so a line submitted again after a takeover finds its tasks."""
        task_ids = []
        for index, submission in enumerate(line.submissions):
            task_id = new_task_id()
            key = f"{record.tenant}/ batch {record.batch_id} {number} {index}"
            earlier = await claim_idempotency_key(self._state, key, task_id, submission)
            if earlier is not None:
                task_ids.append(earlier)
                continue
            await submitter.submit(submission, task_id, key)
            task_ids.append(task_id)
        return task_ids

    async def _cursor(self, record: BatchRecord, lines_done: int) -> _Cursor:
        """This worker's reader of the job's input, at ``lines_done`` (opened again, and
        the custom ids before it seen again, after a takeover)."""
        cursor = self._cursors.get(record.batch_id)
        if cursor is not None and cursor.position == lines_done:
            return cursor
        lines = non_blank(self._state.object_store.lines(record.input_file_id, MAX_LINE_BYTES))
        cursor = _Cursor(lines, vocabulary=await self._vocabulary(record))
        while cursor.position < lines_done:  # ObjectNotFound when the input is gone
            raw = await _next_line(cursor)
            if raw is None:
                break
            custom_id = custom_id_of(raw)
            if custom_id is not None:
                cursor.seen.add(custom_id)
        self._cursors[record.batch_id] = cursor
        return cursor

    async def _cancel_waiting(self, record: BatchRecord, pending: dict[int, bytes], step: StepLines) -> int:
        """The job ends early: cancel its tasks still queued; the tasks still running."""
        finished = set(step.finished)
        ids = [
            task_id
            for number, raw in pending.items()
            if number not in finished
            for task_id in orjson.loads(raw)["task_ids"]
        ]
        running = 0
        for task_id, task in zip(ids, await self._state.store.get_many(ids)):
            if task is None or task.status.is_final:
                continue
            model = task.model or self._state.settings.default_model
            if not await self._state.store.cancel(task_id, self._state.settings.model_scope(model)):
                running += 1  # dispatched already: it finishes
        return running

    async def _refuse_rest(self, record: BatchRecord, lines_done: int, step: StepLines) -> tuple[int, bool]:
        """The lines never submitted go to the error file (up to a step's bound); the lines
        done after it, and whether the input is all read. Once the input is gone, the lines
        never read count as failed, unnamed (the job's errors say why)."""
        code = f"batch_{record.ending}"
        try:
            cursor = None if record.ending == "failed" else await self._cursor(record, lines_done)
            while cursor is not None:
                if step.failed >= REFUSED_PER_STEP:
                    return lines_done, False
                raw = await _next_line(cursor)
                if raw is None:
                    return lines_done, True
                try:
                    custom_id = orjson.loads(raw).get("custom_id")
                except (orjson.JSONDecodeError, AttributeError):
                    custom_id = None
                known = custom_id if isinstance(custom_id, str) else None
                lines_done += step.fail(known, code, f"the job {record.ending} before this line ran")
        except ObjectNotFound:
            pass
        unread = max(0, record.total - lines_done)
        step.failed += unread
        return lines_done + unread, True

    async def _finalize(self, record: BatchRecord) -> None:
        """Join the parts into the output and error files, then end the job."""
        output_id, error_id = await self._results.join_files(record)
        final = {"expired": BatchStatus.EXPIRED, "cancelled": BatchStatus.CANCELLED, "failed": BatchStatus.FAILED}.get(
            record.ending, BatchStatus.COMPLETED
        )
        await self._announce(
            dataclasses.replace(record, status=final, output_file_id=output_id, error_file_id=error_id)
        )
        await self._records.move(
            record.batch_id,
            final,
            (BatchStatus.FINALIZING,),
            output_file_id=output_id or "",
            error_file_id=error_id or "",
        )
        await self._results.delete_parts(record)
        await self._records.release(record.batch_id, self._holder)
        self._paused.pop(record.batch_id, None)
        log.info("batch job ended", extra={"batch_id": record.batch_id, "status": final.value})


async def _next_line(cursor: _Cursor) -> bytes | None:
    if cursor.again:
        line = cursor.again.pop(0)
    else:
        try:
            line = await cursor.lines.__anext__()
        except StopAsyncIteration:
            return None
    cursor.position += 1
    return line

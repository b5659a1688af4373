"""What a batch job's lines come to: each finished line written as OpenAI's output or
error line, the lines of a step stored as numbered parts of the job's output and error
files, and the parts joined into those files when the job ends (``api/jobs/job_driver.py``
drives the job).

A part is written before the checkpoint that counts it, so a crash between the two only
leaves a part that the next step overwrites; the joined files take ids derived from the
job's, so joining again after a crash rewrites the same files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from brimful.api.http.bodies import ApiError, error_body, error_of
from brimful.api.jobs.job_lines import error_line, output_line
from brimful.api.openai.embedding_answer import EmbeddingShape, embeddings_answer
from brimful.api.state import ApiState
from brimful.core.batch_records import BatchRecord
from brimful.core.file_records import OUTPUT_PURPOSE, FileRecord
from brimful.core.task_record import TaskRecord, TaskStatus, task_provenance, task_record_answer

# What the output says of a line whose task ended other than done.
_STATUS_CODES = {TaskStatus.FAILED: 502, TaskStatus.EXPIRED: 408, TaskStatus.CANCELLED: 409}


def part_name(batch_id: str, kind: str, number: int) -> str:
    """The object holding the ``number``-th part of a job's output or error file."""
    return f"{batch_id}.{kind}.{number}"


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of a job's output or error file: the same on every try, so a finalizing
    step run again after a crash rewrites the same file."""
    return f"file-{batch_id[-24:-4]}{'0000' if kind == 'output' else '0001'}"


@dataclass
class StepLines:
    """What one step wrote: lines for the output and error parts, and the lines it ends."""

    output: list[bytes] = field(default_factory=list)
    errors: list[bytes] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0  # the usage of the lines it completed (an embeddings answer's prompt_tokens)
    model: str = ""  # the model of the lines it started

    def fail(self, custom_id: str | None, code: str, message: str) -> int:
        """A line that failed before it ran: its error line written; the one line it ends."""
        self.errors.append(error_line(custom_id, code, message))
        self.failed += 1
        return 1


class BatchResults:
    """Writes one API worker's share of the jobs' results."""

    def __init__(self, state: ApiState) -> None:
        self._state = state

    async def collect(self, record: BatchRecord, pending: dict[int, bytes], step: StepLines) -> int:
        """Write the lines whose tasks are all final; the tasks still running."""
        running = 0
        notes = {number: orjson.loads(raw) for number, raw in pending.items()}
        ids = [task_id for note in notes.values() for task_id in note["task_ids"]]
        found = await self._state.store.get_many(ids)
        records = dict(zip(ids, found))
        for number, note in sorted(notes.items()):
            tasks = [records[task_id] for task_id in note["task_ids"]]
            # A task with no record is still to come (Redis lost it; its Kafka record brings
            # it back when it runs), unless the job is ending.
            unfinished = sum(
                1 for task in tasks if (task is None and not record.ending) or (task and not task.status.is_final)
            )
            if unfinished:
                running += unfinished
                continue
            self._write_line(record, note, tasks, step)
            step.finished.append(number)
            for task_id in note["task_ids"]:  # the job's files hold it now
                self._state.read_results.note(task_id)
        return running

    def _write_line(
        self, record: BatchRecord, note: dict[str, Any], tasks: list[TaskRecord | None], step: StepLines
    ) -> None:
        custom_id, task_ids = note["custom_id"], note["task_ids"]
        request_id = task_ids[0] if task_ids else ""
        missing = [task_id for task_id, task in zip(task_ids, tasks) if task is None]
        if missing:  # its result outlived its retention before it was collected
            step.errors.append(error_line(custom_id, "result_lost", f"task {missing[0]}'s result expired unread"))
            step.failed += 1
            return
        done = [task for task in tasks if task is not None]
        ended = next((task for task in done if task.status is not TaskStatus.DONE), None)
        if ended is not None and ended.status is TaskStatus.CANCELLED and record.ending:
            step.errors.append(
                error_line(custom_id, f"batch_{record.ending}", f"the job {record.ending} before it ran")
            )
            step.failed += 1
            return
        if ended is not None:
            message = (ended.error or {}).get("message", ended.status.value)
            status = _STATUS_CODES.get(ended.status, 502)
            body = error_body(status, f"task_{ended.status.value}", message)
            step.errors.append(output_line(custom_id, request_id, status, body))
            step.failed += 1
            return
        provenance: list[dict[str, Any]] | None = None
        try:
            shape = EmbeddingShape(**note["embedding"]) if note.get("embedding") else None
            if shape is not None:
                body = embeddings_answer(shape, task_ids, done)
                provenance = [task_provenance(task) for task in done]
            else:
                body = task_record_answer(task_ids[0], done[0], self._state.settings.default_model)
        except ApiError as error:
            step.errors.append(output_line(custom_id, request_id, error.status, error_of(error)))
            step.failed += 1
            return
        step.output.append(output_line(custom_id, request_id, 200, body, provenance))
        step.completed += 1
        step.input_tokens += shape.prompt_tokens if shape is not None else 0

    async def write_parts(self, record: BatchRecord, step: StepLines) -> None:
        store = self._state.object_store
        for kind, lines, number in (
            ("output", step.output, record.output_parts),
            ("errors", step.errors, record.error_parts),
        ):
            if lines:
                async with store.writer(part_name(record.batch_id, kind, number)) as writer:
                    await writer.write(b"\n".join(lines) + b"\n")

    # --- finalizing ----------------------------------------------------------------------

    async def join_files(self, record: BatchRecord) -> tuple[str | None, str | None]:
        """Join the parts into the output and error files (None: a file with no line)."""
        output_id = await self._join(record, "output", record.output_parts, f"{record.batch_id}_output.jsonl")
        error_id = await self._join(record, "errors", record.error_parts, f"{record.batch_id}_error.jsonl")
        return output_id, error_id

    async def delete_parts(self, record: BatchRecord) -> None:
        for kind, parts in (("output", record.output_parts), ("errors", record.error_parts)):
            for number in range(parts):
                await self._state.object_store.delete(part_name(record.batch_id, kind, number))

    async def _join(self, record: BatchRecord, kind: str, parts: int, filename: str) -> str | None:
        if not parts:
            return None
        store = self._state.object_store
        file_id = result_file_id(record.batch_id, kind)
        async with store.writer(file_id) as writer:
            for number in range(parts):
                async for chunk in store.chunks(part_name(record.batch_id, kind, number)):
                    await writer.write(chunk)
        now = int(time.time())
        expires_at = now + record.output_expires_s if record.output_expires_s is not None else None
        await self._state.file_records.add(
            FileRecord(file_id, record.tenant, filename, writer.written, OUTPUT_PURPOSE, now, expires_at)
        )
        return file_id

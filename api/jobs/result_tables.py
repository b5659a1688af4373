"""A batch job's output or error file as a table, for ``GET /v1/files/{id}/content?format=``
``parquet`` or ``arrow`` beside its JSONL.

One row per line; columns ``id``, ``custom_id``, ``status_code`` (null for a line that
never ran), ``request_id``, ``body`` (the answer's JSON, as each route's answer has its own
shape), ``error_code`` and ``error_message``. The file is read and written a
group at a time (``ROWS_PER_GROUP`` lines, or fewer once they hold ``BYTES_PER_GROUP``),
each converted in a worker thread, so a large file streams out in bounded memory (about
three times a group's bytes, plus one line) and the event loop never waits on the encoding.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq

from brimful.core.object_store import ObjectStore

FORMATS = {"parquet": "application/vnd.apache.parquet", "arrow": "application/vnd.apache.arrow.stream"}
ROWS_PER_GROUP = 5000
BYTES_PER_GROUP = 8 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024 * 1024
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("custom_id", pa.string()),
        ("status_code", pa.int32()),
        ("request_id", pa.string()),
        ("body", pa.string()),
        ("error_code", pa.string()),
        ("error_message", pa.string()),
    ]
)


class _Collector:
    """A file-like sink whose written bytes are taken as they come."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        taken, self.parts = b"".join(self.parts), []
        return taken


def _batch(lines: list[bytes]) -> pa.RecordBatch:
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for raw in lines:
        line = orjson.loads(raw)
        response = line.get("response") or {}
        error = line.get("error") or {}
        columns["id"].append(line.get("id"))
        columns["custom_id"].append(line.get("custom_id"))
        columns["status_code"].append(response.get("status_code"))
        columns["request_id"].append(response.get("request_id"))
        columns["body"].append(orjson.dumps(response["body"]).decode() if "body" in response else None)
        columns["error_code"].append(error.get("code"))
        columns["error_message"].append(error.get("message"))
    return pa.RecordBatch.from_pydict(columns, schema=SCHEMA)


async def table_chunks(store: ObjectStore, name: str, kind: str) -> AsyncIterator[bytes]:
    """The file's lines as a Parquet file or an Arrow IPC stream, a row group at a time."""
    sink = _Collector()
    writer: Any = (
        pq.ParquetWriter(pa.PythonFile(sink, mode="w"), SCHEMA)
        if kind == "parquet"
        else pyarrow.ipc.new_stream(pa.PythonFile(sink, mode="w"), SCHEMA)
    )
    lines: list[bytes] = []
    held = 0  # bytes of the lines gathered

    def write(group: list[bytes]) -> bytes:
        batch = _batch(group)
        if kind == "parquet":
            writer.write_table(pa.Table.from_batches([batch]))
        else:
            writer.write_batch(batch)
        return sink.take()

    async for line in store.lines(name, MAX_LINE_BYTES):
        if line.strip():
            lines.append(line)
            held += len(line)
        if len(lines) >= ROWS_PER_GROUP or held >= BYTES_PER_GROUP:
            yield await asyncio.to_thread(write, lines)
            lines, held = [], 0
    if lines:
        yield await asyncio.to_thread(write, lines)
    await asyncio.to_thread(writer.close)
    yield sink.take()

"""A job's results as a table stream out a bounded group at a time: by rows, and by bytes
when lines are large, so a file of huge lines never sits in memory whole."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.ipc

from brimful.api.jobs.result_tables import BYTES_PER_GROUP, table_chunks
from brimful.core.object_store import ObjectStore


def test_large_lines_are_grouped_by_bytes(tmp_path: Path) -> None:
    big = "x" * (BYTES_PER_GROUP // 3 + 1)  # three lines pass a group's bytes
    lines = [
        orjson.dumps({"id": f"r{n}", "custom_id": f"c{n}", "response": {"status_code": 200, "body": {"y": big}}})
        for n in range(6)
    ]

    async def export() -> bytes:
        store = ObjectStore.from_url(str(tmp_path))
        async with store.writer("results") as writer:
            await writer.write(b"\n".join(lines) + b"\n")
        return b"".join([chunk async for chunk in table_chunks(store, "results", "arrow")])

    reader = pyarrow.ipc.open_stream(pa.py_buffer(asyncio.run(export())))
    batches = list(reader)
    assert [batch.num_rows for batch in batches] == [3, 3]
    assert pa.Table.from_batches(batches).column("custom_id").to_pylist() == [f"c{n}" for n in range(6)]

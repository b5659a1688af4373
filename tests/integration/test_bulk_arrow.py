"""Bulk submission as an Arrow IPC stream, on the shared stack: a column per input, a task
a row, each answered in order and computed like a JSON task; bad tables get a 4xx naming
the column and row."""

from __future__ import annotations

import struct
import uuid

import aiohttp
import pyarrow as pa
import pyarrow.ipc

from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.stacks import SMALL
from tests.helpers.task_client import TaskClient

ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}


def stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=7)  # several record batches
    return sink.getvalue().to_pybytes()


async def post(stack: EmbeddedStack, body: bytes, query: str = "") -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{stack.api_url}/v1/tasks:batch{query}", data=body, headers=ARROW) as response:
            return response.status, await response.json(content_type=None)


async def test_each_row_becomes_a_task_answered_in_order(stack: EmbeddedStack, client: TaskClient) -> None:
    texts = [f"arrow row {n % 5} {uuid.uuid4().hex[:4] if n % 3 else ''}" for n in range(40)]  # identical ones too
    status, body = await post(stack, stream(pa.table({"TEXT": texts})))
    assert status == 200 and body["accepted"] == 40, body
    for text, result in zip(texts, body["results"]):
        assert (await client.wait_final(result["task_id"]))["outputs"] == expected_outputs(text)
    status, body = await post(
        stack, stream(pa.table({"TEXT": pa.array([b"bytes too"], pa.binary())})), f"?model={SMALL}&priority=low"
    )
    assert status == 200 and body["results"][0]["model"] == SMALL, body
    assert (await client.wait_final(body["results"][0]["task_id"]))["outputs"] == expected_outputs("bytes too")


async def test_bad_tables_get_a_4xx_naming_the_column_and_row(stack: EmbeddedStack) -> None:
    cases = [
        (b"not arrow at all", "", 400, "Arrow IPC stream"),
        (stream(pa.table({"IMAGE": ["x"]})), "", 422, "unknown: IMAGE"),
        (stream(pa.table({"TEXT": ["a", None, "c"]})), "", 422, "row 1"),
        (stream(pa.table({"TEXT": [1, 2]})), "", 422, "string or binary"),
        (stream(pa.table({"TEXT": ["a"], "EXTRA": ["b"]})), "", 422, "EXTRA"),
        (stream(pa.table({"TEXT": ["a"]})), "?model=nope", 422, "nope"),
        (stream(pa.table({"TEXT": ["a"]})), "?priority=urgent", 422, "priority"),
        (stream(pa.table({"TEXT": ["a"] * (stack.settings.max_bulk_tasks + 1)})), "", 413, "limit"),
        (stream(pa.table({"TEXT": pa.array([], pa.string())})), "", 422, "no row"),
    ]
    for body, query, status, says in cases:
        got, answer = await post(stack, body, query)
        assert got == status and says in answer["error"]["message"], (says, got, answer)


def _patched(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) == 1, "the pattern to patch must be found once"
    return body.replace(old, new)


def hostile_streams() -> list[tuple[str, bytes, int, str]]:
    """(what, body, status, what the answer names): streams whose metadata lies or whose
    schema Python cannot take as it is."""
    sink = pa.BufferOutputStream()
    bomb = pa.table({"TEXT": ["\0" * (64 * 1024 * 1024)]})  # 64 MiB of zeros: a few KB compressed
    with pyarrow.ipc.new_stream(sink, bomb.schema, options=pyarrow.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(bomb)
    compressed_bomb = sink.getvalue().to_pybytes()
    one_row = stream(pa.table({"TEXT": ["q" * 1000]}))
    huge_buffer = _patched(one_row, struct.pack("<q", 1000), struct.pack("<q", 2**50))  # 1 PiB of values
    return [
        ("a compressed bomb", compressed_bomb, 413, "decompressed"),
        ("a buffer of 1 PiB", huge_buffer, 413, "outside its message"),
        ("duplicate columns", stream(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["TEXT", "TEXT"])),
         400, "more than once"),
        ("a column name not UTF-8", _patched(stream(pa.table({"TEXU": ["a"]})), b"TEXU", b"TE\xff\xfe"), 400, "Arrow"),
        ("a stream cut short", one_row[: len(one_row) // 2], 400, "Arrow"),
    ]  # fmt: skip


async def test_streams_that_lie_about_their_size_or_names_are_a_4xx_before_any_allocation(
    stack: EmbeddedStack, client: TaskClient
) -> None:
    compressed = hostile_streams()[0][1]
    assert len(compressed) < 64 * 1024  # the body is small: only its claim is large
    for what, body, status, says in hostile_streams():
        got, answer = await post(stack, body)
        assert got == status and says in answer["error"]["message"], (what, got, answer)
    # A compressed stream within the limit is read as any other.
    sink = pa.BufferOutputStream()
    fine = pa.table({"TEXT": ["compressed but honest"] * 3})
    with pyarrow.ipc.new_stream(sink, fine.schema, options=pyarrow.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(fine)
    got, answer = await post(stack, sink.getvalue().to_pybytes())
    assert got == 200 and answer["accepted"] == 3, answer
    done = await client.wait_final(answer["results"][0]["task_id"])
    assert done["outputs"] == expected_outputs("compressed but honest")

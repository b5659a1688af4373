"""The committed protobuf modules are exactly what schemas/brimful.proto generates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "brimful.proto", tmp_path / "schemas" / "brimful.proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--pyi_out=.", "schemas/brimful.proto"],
        cwd=tmp_path,
        check=True,
    )
    for name in ("brimful_pb2.py", "brimful_pb2.pyi"):
        fresh = (tmp_path / "schemas" / name).read_text()
        committed = (ROOT / "schemas" / name).read_text()
        assert fresh == committed, f"schemas/{name} is stale: run `make schemas`"


def test_messages_round_trip() -> None:
    from brimful.schemas import DeadLetter, TaskRequest

    request = TaskRequest(task_id="ab" * 16, model="m", submitted_at_ms=1)
    request.inputs["TEXT"].datatype = "BYTES"
    request.inputs["TEXT"].bytes_contents.append("🙂".encode())
    letter = DeadLetter(request=request, error_class="model_error", batch_task_ids=["x", "y"])
    assert DeadLetter.FromString(letter.SerializeToString()) == letter

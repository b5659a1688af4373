"""The reference model: trivial on purpose, so every result proves it belongs to its own input.

Input ``TEXT`` (one UTF-8 string per row); outputs ``SHA256`` (lowercase hex digest of
the row's bytes) and ``LENGTH`` (its byte length, int64). It is served with a fixed
shape of exactly ``batch_size`` rows, so Triton itself refuses any other call.

Fault hooks (documented, for fault-injection tests and drills):

- a call fails with a model error when any row's TEXT starts with ``!fail``;
- a call fails with a model error when a row starts with ``!flaky`` *and* the fault file
  exists (the model host's ``--fault-file``): a fault that can be switched off;
- a call hangs for ``hang_s`` the first time it sees a row starting with ``!hang-once``;
- every call hangs while the hang file exists (the model host's ``--hang-file``), for at
  most ``HANG_FILE_MAX_S``: an endpoint that stops answering, without freezing the server's
  processes (a model host frozen with SIGSTOP and thawed under load can answer a call with
  another call's rows: PyTriton's fault, see bench/results/reliability-log.md).

``ReferenceModel(call_s=...)`` also makes every call take at least ``call_s``: a
stand-in for a memory-bound GPU model whose cost does not depend on the real rows.
With ``seen_log``, it appends every non-empty row it is given to that file, one per
line, so a test can check what reached the model.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

MODEL_NAME = "brimful_reference"
FAIL_PREFIX = b"!fail"
FLAKY_PREFIX = b"!flaky"
HANG_ONCE_PREFIX = b"!hang-once"
HANG_FILE_MAX_S = 30.0  # a hang file left behind must not hang the server for ever
HANG_FILE_POLL_S = 0.05


def hang_file_at(template: str | Path, grpc_port: int) -> Path:
    """A model host's hang file: ``template`` with ``{grpc_port}`` filled in, so that the
    hosts of one stack, given the same flag, each have their own."""
    return Path(str(template).format(grpc_port=grpc_port))


class ReferenceModelFault(RuntimeError):
    """Raised by the fault hook; Triton reports it to the caller as a model error."""


def reference_infer(text: NDArray[Any]) -> dict[str, NDArray[Any]]:
    """Compute SHA256 and LENGTH for every row of ``text`` (shape ``(rows, 1)``, bytes)."""
    rows = [bytes(value) for value in text.reshape(-1)]
    for index, row in enumerate(rows):
        if row.startswith(FAIL_PREFIX):
            raise ReferenceModelFault(f"row {index} starts with {FAIL_PREFIX.decode()!r}: fault hook triggered")
    digests = np.array([hashlib.sha256(row).hexdigest().encode() for row in rows], dtype=object)
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    return {"SHA256": digests.reshape(-1, 1), "LENGTH": lengths.reshape(-1, 1)}


class ReferenceModel:
    """The reference model with its run-time hooks, as the model host serves it."""

    def __init__(
        self,
        call_s: float = 0.0,
        hang_s: float = 3.0,
        fault_file: Path | None = None,
        seen_log: Path | None = None,
        hang_file: Path | None = None,
    ) -> None:
        self.call_s = call_s
        self.hang_s = hang_s
        self.fault_file = fault_file
        self.seen_log = seen_log
        self.hang_file = hang_file
        self._hung_for: set[bytes] = set()

    def __call__(self, text: NDArray[Any]) -> dict[str, NDArray[Any]]:
        started = time.monotonic()
        if self.hang_file is not None:
            while self.hang_file.exists() and time.monotonic() - started < HANG_FILE_MAX_S:
                time.sleep(HANG_FILE_POLL_S)
        rows = [bytes(value) for value in text.reshape(-1)]
        if self.seen_log is not None:
            with self.seen_log.open("ab") as log:
                log.writelines(row.replace(b"\n", b" ") + b"\n" for row in rows if row)
        for row in rows:
            if row.startswith(HANG_ONCE_PREFIX) and row not in self._hung_for:
                self._hung_for.add(row)
                time.sleep(self.hang_s)
            if row.startswith(FLAKY_PREFIX) and self.fault_file is not None and self.fault_file.exists():
                raise ReferenceModelFault(f"{FLAKY_PREFIX.decode()!r} row while the fault is switched on")
        outputs = reference_infer(text)
        remaining = self.call_s - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        return outputs

"""What an Arrow IPC stream claims, checked before pyarrow allocates or decompresses it.

pyarrow trusts a stream's metadata: a record batch's buffers may declare any length, and a
compressed buffer's first eight bytes declare its size once inflated (a 2,560-byte body can
claim 64 MiB, a 4 MB body about 100 GiB). So each message's metadata (a FlatBuffer, read
here by hand: a few fields of ``Message.fbs``) is read first, and the stream is refused
unless every buffer lies inside its message's body, every batch's rows are within the
row limit, and the bytes it holds once inflated are within the byte limit: the memory a
stream can take is the limit an uncompressed body has, whatever its codec.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc

_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3  # MessageHeader's union tags


class StreamRefused(ValueError):
    """A stream whose metadata claims more than it may; the message says what."""


@dataclass(frozen=True)
class _Table:
    """A FlatBuffers table in ``data`` at ``position``: its fields by number."""

    data: bytes
    position: int

    def _field(self, number: int) -> int | None:
        vtable = self.position - _int32(self.data, self.position)
        vtable_size = _uint16(self.data, vtable)
        slot = 4 + 2 * number
        if slot >= vtable_size:
            return None
        offset = _uint16(self.data, vtable + slot)
        return self.position + offset if offset else None

    def scalar(self, number: int, fmt: str, default: int = 0) -> int:
        at = self._field(number)
        return default if at is None else int(struct.unpack_from("<" + fmt, self.data, at)[0])

    def table(self, number: int) -> _Table | None:
        at = self._field(number)
        return None if at is None else _Table(self.data, at + _uint32(self.data, at))

    def structs(self, number: int, size: int) -> list[tuple[int, int]]:
        """A vector of structs of two int64s (FieldNode, Buffer)."""
        at = self._field(number)
        if at is None:
            return []
        start = at + _uint32(self.data, at)
        count = _uint32(self.data, start)
        if count > (len(self.data) - start) // size:
            raise ValueError("an Arrow message's metadata is cut short")
        return [struct.unpack_from("<qq", self.data, start + 4 + i * size) for i in range(count)]


def check_stream(body: bytes, max_bytes: int, max_rows: int) -> None:
    """StreamRefused unless every message of the stream keeps within the bounds above;
    ValueError (or pyarrow's ArrowInvalid) when its metadata cannot be read."""
    inflated = 0
    try:
        reader = pyarrow.ipc.MessageReader.open_stream(pa.py_buffer(body))
        for message in reader:
            inflated += _message_bytes(message, max_rows)
            if inflated > max_bytes:
                raise StreamRefused(f"the stream holds more than {max_bytes} bytes once decompressed")
    except (struct.error, IndexError) as error:  # a 400: the stream cannot be read at all
        raise ValueError("an Arrow message's metadata is not well formed") from error


def _message_bytes(message: pyarrow.ipc.Message, max_rows: int) -> int:
    """The bytes a message's body takes once read (decompressed where it is compressed)."""
    metadata = message.metadata.to_pybytes()
    root = _Table(metadata, _uint32(metadata, 0))
    kind = root.scalar(1, "B")
    if kind == _SCHEMA:
        return len(metadata)
    if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH):
        raise StreamRefused("the stream holds a message that is neither a schema nor a batch")
    header = root.table(2)
    batch = header.table(1) if header is not None and kind == _DICTIONARY_BATCH else header
    if batch is None:
        raise StreamRefused("an Arrow batch message has no header")
    rows = batch.scalar(0, "q")
    if not 0 <= rows <= max_rows:
        raise StreamRefused(f"a batch declares {rows} rows; at most {max_rows} are taken")
    body = message.body.to_pybytes() if message.body is not None else b""
    compressed = batch.table(3) is not None
    total = 0
    for offset, length in batch.structs(2, 16):
        if offset < 0 or length < 0 or offset + length > len(body):
            raise StreamRefused(f"a buffer declares {length} bytes at {offset}, outside its message's body")
        total += _inflated_length(body, offset, length) if compressed and length >= 8 else length
    return total


def _inflated_length(body: bytes, offset: int, length: int) -> int:
    declared = struct.unpack_from("<q", body, offset)[0]
    if declared == -1:  # stored as is
        return length - 8
    if declared < 0:
        raise StreamRefused("a compressed buffer declares a negative size")
    return int(declared)


def _uint32(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0])


def _int32(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<i", data, at)[0])


def _uint16(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<H", data, at)[0])

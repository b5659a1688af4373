"""Where uploaded files and batch results live: a local folder (the embedded stack) or an
S3 bucket (production), through pyarrow's filesystem layer, which the project already
carries for its Parquet exports.

One URL says where: a path or ``file:///path`` for a folder, ``s3://bucket/prefix`` for S3
(options in its query, as pyarrow reads them: ``?endpoint_override=host:port&scheme=http``
for an S3-compatible server; credentials from the standard ``AWS_*`` variables). Every call
runs in a worker thread, so the event loop never waits on a disk or the network; data moves
in chunks of ``CHUNK_BYTES``, so a file of any size is read or written in bounded memory.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qsl, unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

CHUNK_BYTES = 1 << 20
# An object being written is named ``{name}{WRITING}{random}`` and moved to its name once
# whole: a writer stopped midway (a crash) leaves a name the sweep knows to remove
# (``api/openai/storage_sweep.py``), never a partial object under a name a record may point to.
WRITING = ".writing-"


@dataclass(frozen=True)
class StoredObject:
    """One object as the store lists it."""

    name: str
    size: int
    modified_s: float  # seconds since the epoch


class ObjectNotFound(LookupError):
    """No object of that name."""


class LineTooLong(ValueError):
    """A line of an object read as lines is longer than its reader takes."""


class ObjectStore:
    """Named objects under one root of one filesystem."""

    def __init__(self, filesystem: pafs.FileSystem, root: str) -> None:
        self._fs = filesystem
        self._root = root.rstrip("/")

    @classmethod
    def from_url(cls, url: str) -> ObjectStore:
        """The store a URL names (see the module's docstring); a local folder is created."""
        if "://" not in url or urlparse(url).scheme == "file":
            folder = Path(urlparse(url).path if "://" in url else url).absolute()
            folder.mkdir(parents=True, exist_ok=True)  # once, at start-up
            return cls(pafs.LocalFileSystem(), str(folder))
        return cls(*_s3(url))

    def _path(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not an object name: {name!r}")
        return f"{self._root}/{name}"

    async def size(self, name: str) -> int:
        """The object's size in bytes; ObjectNotFound if there is none."""
        info = await asyncio.to_thread(self._fs.get_file_info, self._path(name))
        if info.type == pafs.FileType.NotFound:
            raise ObjectNotFound(name)
        return int(info.size)

    async def delete(self, name: str) -> None:
        """Remove the object; nothing if it is already gone."""
        try:
            await asyncio.to_thread(self._fs.delete_file, self._path(name))
        except FileNotFoundError:
            pass

    async def listing(self, most: int) -> list[StoredObject]:
        """Up to ``most`` of the objects under the root, in the store's order."""
        selector = pafs.FileSelector(self._root, allow_not_found=True)
        infos = await asyncio.to_thread(self._fs.get_file_info, selector)
        return [
            StoredObject(info.base_name, int(info.size or 0), info.mtime.timestamp() if info.mtime else 0.0)
            for info in infos[:most]
            if info.type == pafs.FileType.File
        ]

    def writer(self, name: str) -> ObjectWriter:
        """An object written in chunks (``async with``) under a temporary name: moved to
        ``name`` once closed without an error, removed when the block raises."""
        return ObjectWriter(self, name)

    async def chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The object's bytes, a chunk at a time; ObjectNotFound if there is none."""
        try:
            stream = await asyncio.to_thread(self._fs.open_input_stream, self._path(name))
        except FileNotFoundError as error:
            raise ObjectNotFound(name) from error
        try:
            while True:
                chunk = await asyncio.to_thread(stream.read, chunk_bytes)
                if not chunk:
                    return
                yield bytes(chunk)
        finally:
            await asyncio.to_thread(stream.close)

    async def lines(self, name: str, max_line_bytes: int) -> AsyncIterator[bytes]:
        """The object's lines without their ending, one at a time, however long the file;
        LineTooLong past ``max_line_bytes`` (so one line never fills the memory)."""
        rest = b""
        async for chunk in self.chunks(name):
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            if len(rest) > max_line_bytes or any(len(line) > max_line_bytes for line in parts):
                raise LineTooLong(name)
            for line in parts:
                yield line.rstrip(b"\r")
        if rest:
            yield rest.rstrip(b"\r")


class ObjectWriter:
    """Writes one object in chunks; see ``ObjectStore.writer``."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self._store = store
        self._name = name
        self._stream: pa.NativeFile | None = None
        self._buffer = bytearray()
        self._writing = ""
        self.written = 0

    async def __aenter__(self) -> ObjectWriter:
        self._store._path(self._name)  # a name the store takes, checked before a byte is written
        self._writing = f"{self._name}{WRITING}{secrets.token_hex(6)}"
        path = self._store._path(self._writing)
        self._stream = await asyncio.to_thread(self._store._fs.open_output_stream, path)
        return self

    async def write(self, data: bytes) -> None:
        """Add bytes; they reach the store a chunk at a time."""
        self._buffer += data
        self.written += len(data)
        if len(self._buffer) >= CHUNK_BYTES:
            await self._drain()

    async def _drain(self) -> None:
        assert self._stream is not None
        chunk, self._buffer = bytes(self._buffer), bytearray()
        await asyncio.to_thread(self._stream.write, chunk)

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._stream is not None
        done = False
        try:
            if kind is None and self._buffer:
                await self._drain()
            await asyncio.to_thread(self._stream.close)
            if kind is None:
                source, target = self._store._path(self._writing), self._store._path(self._name)
                await asyncio.to_thread(self._store._fs.move, source, target)
                done = True
        finally:
            if not done:
                if not self._stream.closed:
                    await asyncio.to_thread(self._stream.close)
                await self._store.delete(self._writing)


# What an s3:// URL's query may set, as pyarrow names it.
_S3_OPTIONS = ("endpoint_override", "scheme", "region")


def _s3(url: str) -> tuple[pafs.FileSystem, str]:
    """The S3 filesystem and root an ``s3://[key:secret@]bucket/prefix?options`` URL names,
    with background writes off: a write waits for its part to be sent, so a writer faster
    than the network (an upload on a fast link) holds one part, not the whole file: writing
    200 MB from a fresh process peaked 69-70 MB above its start with them off, 412-419 MB
    with them on (docs/openai.md, "Measured")."""
    parts = urlparse(url)
    if parts.scheme != "s3" or not parts.hostname:
        raise ValueError(f"not a folder or an s3://bucket/prefix URL: {url!r}")
    query = dict(parse_qsl(parts.query))
    unknown = sorted(set(query) - set(_S3_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) in the file store's URL: {', '.join(unknown)}")
    filesystem = pafs.S3FileSystem(
        access_key=unquote(parts.username) if parts.username else None,
        secret_key=unquote(parts.password) if parts.password else None,
        background_writes=False,
        **{name: query[name] for name in _S3_OPTIONS if name in query},
    )
    return filesystem, f"{parts.hostname}{parts.path}".rstrip("/")

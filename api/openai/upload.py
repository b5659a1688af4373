"""Taking a file upload (``multipart/form-data``, as OpenAI's client sends it) straight into
the object store, in bounded memory however large the file.

The body is parsed as it arrives (python-multipart's streaming parser); the ``file`` part's
bytes go to the store a chunk at a time and the small fields (``purpose``) are kept. Every
dimension has a bound, each answered with a 4xx naming it: the file's size (413, before a
byte is read when the request declares it), the parts, a field's size and a part's headers
(400), the time between two chunks and the time of the whole (408). Whatever stops an
upload, the partial object is removed; it is written under a temporary name until whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from brimful.api.http.bodies import ApiError, client_closed, too_slow
from brimful.api.openai.file_names import stored_name
from brimful.core.number_text import whole_number
from brimful.core.object_store import ObjectStore

MAX_PARTS = 8
MAX_FIELD_BYTES = 1024
# The multipart framing around a file: boundaries, part headers, the small fields.
FRAMING_BYTES = 64 * 1024


@dataclass
class Upload:
    """What an upload carried besides the file's bytes, which are in the store."""

    filename: str = ""
    bytes: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    has_file: bool = False


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _FormReader:
    """python-multipart's callbacks for one upload: parts, their headers and data, each
    bounded; the file's bytes are kept in ``pending`` until written to the store."""

    def __init__(self, upload: Upload, limit: int) -> None:
        self.upload = upload
        self.limit = limit
        self.parts: list[_Part] = []
        self.pending: list[bytes] = []  # the file's bytes parsed from the latest chunk, to store
        self._header_name = bytearray()
        self._header_value = bytearray()

    def parser(self, boundary: bytes) -> MultipartParser:
        return MultipartParser(
            boundary,
            {
                "on_part_begin": self.on_part_begin,
                "on_header_field": self.on_header_field,
                "on_header_value": self.on_header_value,
                "on_header_end": self.on_header_end,
                "on_headers_finished": self.on_headers_finished,
                "on_part_data": self.on_part_data,
                "on_part_end": self.on_part_end,
            },
            max_header_count=16,
            max_header_size=8192,
        )

    def on_part_begin(self) -> None:
        if len(self.parts) >= MAX_PARTS:
            raise ApiError(400, "invalid_request", f"the upload has more than {MAX_PARTS} parts")
        self.parts.append(_Part())

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name.extend(data[start:end])

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value.extend(data[start:end])

    def on_header_end(self) -> None:
        self.parts[-1].headers[bytes(self._header_name).lower()] = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def on_headers_finished(self) -> None:
        part = self.parts[-1]
        _, disposition = parse_options_header(part.headers.get(b"content-disposition", b""))
        part.name = disposition.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in disposition:
            part.filename = disposition[b"filename"].decode("utf-8", "replace")
        if part.name == "file":
            if self.upload.has_file:
                raise ApiError(400, "invalid_request", "the upload carries more than one 'file' part")
            self.upload.has_file = True
            self.upload.filename = stored_name(part.filename)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self.parts[-1]
        if part.name == "file":
            self.upload.bytes += end - start
            if self.upload.bytes > self.limit:
                raise ApiError(413, "file_too_large", f"the file exceeds the limit of {self.limit} bytes")
            self.pending.append(data[start:end])
            return
        part.data += data[start:end]
        if len(part.data) > MAX_FIELD_BYTES:
            raise ApiError(400, "invalid_request", f"field {part.name[:32]!r} exceeds {MAX_FIELD_BYTES} bytes")

    def on_part_end(self) -> None:
        part = self.parts[-1]
        if part.name != "file" and part.name:
            self.upload.fields[part.name] = part.data.decode("utf-8", "replace")


async def receive_upload(
    request: Request, store: ObjectStore, object_name: str, limit: int, idle_timeout_s: float, total_timeout_s: float
) -> Upload:
    """Read the multipart body: the part named ``file`` into ``object_name``, at most
    ``limit`` bytes; the other parts as short text fields."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise ApiError(400, "invalid_request", "send the file as multipart/form-data with a 'file' part")
    declared = request.headers.get("content-length")
    if declared is not None and whole_number(declared, limit + FRAMING_BYTES + 1, 2**62) is not None:
        raise ApiError(413, "file_too_large", f"the upload of {declared} bytes exceeds the limit of {limit} bytes")
    upload = Upload()
    reader = _FormReader(upload, limit)
    parser = reader.parser(boundary)
    async with store.writer(object_name) as writer:
        async for chunk in _chunks(request, idle_timeout_s, total_timeout_s):
            try:
                parser.write(chunk)
            except MultipartParseError as error:
                raise ApiError(400, "invalid_request", f"the multipart body is malformed: {error}") from error
            for data in reader.pending:
                await writer.write(data)
            reader.pending.clear()
        parser.finalize()
        if not upload.has_file:
            raise ApiError(400, "invalid_request", "the upload has no 'file' part")
    return upload


async def _chunks(request: Request, idle_timeout_s: float, total_timeout_s: float) -> AsyncIterator[bytes]:
    """The body's chunks; 408 when none comes for ``idle_timeout_s`` (a slow upload of a
    large file is fine, a stalled one is not) or the whole has taken ``total_timeout_s``
    (one that trickles for ever is not either), 499 when the client hangs up."""
    stream = request.stream().__aiter__()
    deadline = asyncio.get_running_loop().time() + total_timeout_s
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(min(idle_timeout_s, left)):
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError as error:
            if left <= idle_timeout_s:
                raise too_slow(f"the upload took longer than {total_timeout_s:g} s in all") from error
            raise too_slow(f"the upload stalled: nothing came for {idle_timeout_s:g} s") from error
        except ClientDisconnect as error:
            raise client_closed("during the upload") from error
        if chunk:
            yield chunk

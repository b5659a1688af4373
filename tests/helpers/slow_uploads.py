"""An upload that trickles: a byte every half second, until told to stop or answered."""

from __future__ import annotations

import asyncio


def upload_head(key: str, body_bytes: int) -> bytes:
    """The head of a multipart upload of a file part, declaring ``body_bytes``."""
    return (
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: multipart/form-data; boundary=b0\r\nContent-Length: %d\r\n\r\n"
        b'--b0\r\nContent-Disposition: form-data; name="file"; filename="slow.jsonl"\r\n\r\n'
    ) % (key.encode(), body_bytes)


async def trickle(port: int, key: str, stop: asyncio.Event) -> bytes:
    """Send an upload a byte every half second until ``stop`` or the server answers; the
    head of what it answered (b"" if nothing, or the connection dropped)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(upload_head(key, 10_000_000))
        while not stop.is_set() and not reader.at_eof():
            writer.write(b"x")
            try:
                return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
            except TimeoutError:
                continue
            except (asyncio.IncompleteReadError, ConnectionError):
                return b""
        return b""
    finally:
        writer.close()

"""A real server made slow on demand: a TCP proxy that holds the server's replies back.

A test points a client (the broker, for its S3 storage) at the proxy, and sets
``delay_s`` when the server should answer late: each chunk of the reply is passed on
that long after it arrived, in order, so every request waits at least that long while
the bytes themselves are untouched. The proxy runs its own event loop in a thread, so a
client started outside the test's loop (a broker started by a fixture) is served too.
"""

from __future__ import annotations

import asyncio
import threading

from brimful.stack import free_port

# How long the proxy's thread may take to start or stop.
THREAD_WAIT_S = 10.0
CHUNK_BYTES = 65536
QUEUED_CHUNKS = 1024  # past this, reading the server's reply waits


class SlowReplies:
    """A proxy on ``port`` to ``127.0.0.1:upstream_port``; replies are ``delay_s`` late
    (0 until set)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="slow-replies", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(THREAD_WAIT_S):
            raise RuntimeError(f"the proxy did not start within {THREAD_WAIT_S:g} s")

    def stop(self) -> None:
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(THREAD_WAIT_S)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await self._stopped.wait()
        # Connections still open when the test ends: closed with the proxy.
        left = asyncio.all_tasks() - {asyncio.current_task()}
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        replies: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=QUEUED_CHUNKS)
        await asyncio.gather(
            self._pipe(client_reader, upstream_writer),
            self._take_replies(upstream_reader, replies),
            self._pass_replies_late(replies, client_writer),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(CHUNK_BYTES):
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    async def _take_replies(self, reader: asyncio.StreamReader, replies: asyncio.Queue[tuple[float, bytes]]) -> None:
        """Each chunk of the reply with when it is due: its arrival plus the delay then set
        (so the delays of one reply's chunks do not add up)."""
        loop = asyncio.get_running_loop()
        try:
            while chunk := await reader.read(CHUNK_BYTES):
                await replies.put((loop.time() + self.delay_s, chunk))
        finally:
            await replies.put((0.0, b""))  # the end

    @staticmethod
    async def _pass_replies_late(replies: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, chunk = await replies.get()
                if not chunk:
                    return
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

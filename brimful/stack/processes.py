"""Child processes the embedded stack starts, and how to wait for and stop them."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class StackError(RuntimeError):
    """A component did not start."""


@dataclass
class ManagedProcess:
    """One child in a process group of its own, so stopping it stops its children too
    (Triton's server and backend stubs run under the PyTriton host)."""

    name: str
    argv: Sequence[str]
    env: dict[str, str]
    log_path: Path | None
    stop_timeout_s: float = 10.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        # The child keeps its own copy of the descriptor: ours closes once it is started.
        with open(self.log_path, "ab") if self.log_path else contextlib.nullcontext() as log_file:
            self._proc = subprocess.Popen(
                list(self.argv),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT if log_file else None,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the whole group, wait, then kill what is left. Returns the exit code."""
        if self._proc is None:
            return None
        pgid = self._proc.pid
        if self._proc.poll() is None:
            _signal_group(pgid, sig)
            try:
                self._proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        # Grandchildren can outlive their parent; the group takes them all.
        _signal_group(pgid, signal.SIGKILL)
        if self._proc.poll() is None:
            self._proc.wait(timeout=5)
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (for crash tests)."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=5)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_handed_out: set[int] = set()  # ports free_port gave in this process: never given twice


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now, chosen outside the
    kernel's ephemeral range: a port from that range can be taken as the local end of some
    outgoing connection (a Kafka or Redis client's) before its server gets to bind it."""
    low, high = _ephemeral_range()
    outside = [span for span in ((10000, low), (high + 1, 65536)) if span[1] - span[0] > 1000]
    for _ in range(200):  # bounded: a machine with every such port busy falls back below
        start, end = random.choice(outside) if outside else (0, 0)
        port = random.randrange(start, end) if outside else 0
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, process: ManagedProcess | None = None) -> float:
    """Poll ``check`` until true; raise StackError naming ``what`` after ``timeout_s`` or
    as soon as ``process`` dies. Returns the seconds it took."""
    started = time.monotonic()
    delay = 0.02
    while not check():
        if process is not None and not process.running():
            raise StackError(f"{what}: process exited early (see {process.log_path})")
        if time.monotonic() - started > timeout_s:
            raise StackError(
                f"{what}: not ready after {timeout_s:.0f} s (see {process.log_path if process else 'logs'})"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    return time.monotonic() - started

"""free_port: ports a server can still bind when its turn comes."""

from __future__ import annotations

import socket

import pytest

from brimful.stack import free_port, processes
from brimful.stack.processes import _ephemeral_range, _handed_out


def test_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not [port for port in ports if low <= port <= high]


def test_a_port_someone_listens_on_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", free_port()))
    busy.listen()
    taken = busy.getsockname()[1]
    _handed_out.discard(taken)  # as if another process had chosen it
    wanted = free_port()
    _handed_out.discard(wanted)
    offers = iter([taken, wanted])
    monkeypatch.setattr(processes.random, "randrange", lambda start, end: next(offers))
    try:
        assert free_port() == wanted
    finally:
        busy.close()

"""Commands framed by hiredis are byte for byte what redis-py's own packer sends."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from brimful.core.redis_client import HiredisPackingConnection

COMMANDS = [
    ("GET", "brimful:task:abc"),
    ("EVALSHA", "0" * 40, 2, b"k1", "k2", 3, 1.5, -7, 10**20, 0.1),
    ("ZADD", "z", 1e-7, "a", 1e20, "b", -0.0, "c", 2**63, "d", float("inf"), "e", 1 / 3, "f"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT PAUSE", 1000),
    ("SET", "k", "é🙂", "PX", 3600000),
    ("SET", b"k", memoryview(b"\x00\x01binary"), bytearray(b"more")),
    ("HSET", "big", "v", b"x" * 100_000),
    ("EVALSHA", "a" * 40, 64, *(f"task-{n}" for n in range(64)), *(b"o" * n for n in range(64))),
]


def _framed(connection: Connection, command: tuple[object, ...]) -> bytes:
    return b"".join(bytes(part) for part in connection.pack_command(*command))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: str(command[0]))
def test_the_wire_bytes_are_redis_py_s(command: tuple[object, ...]) -> None:
    assert _framed(HiredisPackingConnection(), command) == _framed(Connection(), command)


def test_what_redis_py_refuses_is_refused() -> None:
    with pytest.raises(DataError):
        HiredisPackingConnection().pack_command("SET", "k", True)
    with pytest.raises(DataError):
        HiredisPackingConnection().pack_command("SET", "k", None)


def test_text_under_another_encoding_is_encoded_as_redis_py_encodes_it() -> None:
    command = ("SET", "clé", "déjà")
    packed = _framed(HiredisPackingConnection(encoding="latin-1"), command)
    assert packed == _framed(Connection(encoding="latin-1"), command)
    assert "déjà".encode("latin-1") in packed

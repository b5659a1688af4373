"""Redis commands framed by hiredis.

redis-py's asyncio client frames every command in Python (its synchronous client uses
hiredis when installed): for the task store's scripts, whose arguments are a batch's 64
task ids and fields, that framing was the batcher's largest single cost in a profile at
saturation. ``HiredisPackingConnection`` frames the same bytes in C.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

_AS_IS = frozenset({bytes, str, int, float})


class HiredisPackingConnection(Connection):
    """A connection whose commands hiredis frames: the wire format is redis-py's, byte for
    byte (each argument encoded by the connection's own encoder first)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        # A command named with its subcommand ("CONFIG GET") goes as two arguments, as redis-py sends it.
        if isinstance(name, str):
            args = (*name.encode().split(), *args[1:])
        elif b" " in name:
            args = (*name.split(), *args[1:])
        # hiredis encodes str, int and float as redis-py does; what it would take differently
        # (a bool, which redis-py refuses) or not at all (views, other types) goes through
        # redis-py's encoder first.
        if not all(type(arg) in _AS_IS for arg in args):
            encode = self.encoder.encode
            args = tuple(arg if type(arg) in _AS_IS else bytes(encode(arg)) for arg in args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError as error:
            raise DataError(str(error)) from error

"""Numbers written by a client, read one way for every route: ASCII only, bounded, finite.

Python's ``str.isdigit`` accepts ``²`` and ``int`` refuses it; ``int`` and ``float`` accept
Arabic-Indic digits, ``float`` accepts ``inf`` and ``nan``, and JSON's ``1e400`` arrives as
``inf``, which ``int`` cannot take. Each reader here answers None for anything that is not
plainly the number asked for, so the caller's 4xx names the field; none raises.
"""

from __future__ import annotations

import math
import re

_WHOLE = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,4})?")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def whole_number(value: object, low: int, high: int) -> int | None:
    """A whole number from ``low`` to ``high``: a JSON integer (not a bool or a float), or
    text of ASCII digits; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and _WHOLE.fullmatch(value):
        number = int(value)
    else:
        return None
    return number if low <= number <= high else None


def finite_number(value: object, low: float, high: float) -> float | None:
    """A finite number from ``low`` to ``high``: a JSON number (not a bool), or decimal text
    in ASCII; None for anything else, ``inf`` and ``nan`` among them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = float(value) if abs(value) < 2**63 else math.inf
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = float(value)
    else:
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def duration_s(text: object, longest_s: int) -> int | None:
    """Seconds from a count and a unit (``90s``, ``30m``, ``24h``), from 1 to ``longest_s``;
    None for anything else."""
    if not isinstance(text, str) or len(text) < 2 or text[-1] not in _DURATION_UNITS:
        return None
    count = whole_number(text[:-1], 1, longest_s)
    if count is None:
        return None
    seconds = count * _DURATION_UNITS[text[-1]]
    return seconds if seconds <= longest_s else None

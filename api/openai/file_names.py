"""A file's name as a client gave it, kept safe to store, list and send back.

An upload's name is what its multipart part says: any Unicode, perhaps a path, perhaps
control characters. It is stored as its last path segment without control or format
characters (``Cc``, ``Cf``, line and paragraph separators), at most 255 characters, and sent
back in ``Content-Disposition`` as RFC 6266 asks: an ASCII ``filename`` any client reads, and
the exact name as ``filename*`` (RFC 8187, UTF-8, percent-encoded).
"""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

NAME_MAX_CHARS = 255
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def stored_name(given: str | None, fallback: str = "upload") -> str:
    """The name to keep: the last segment of ``given`` (``/`` or ``\\``), without characters
    that would break a header, a log line or a terminal; ``fallback`` when nothing is left."""
    last = (given or "").replace("\\", "/").rsplit("/", 1)[-1]
    kept = "".join(char for char in last if unicodedata.category(char) not in _UNSAFE_CATEGORIES).strip()
    return kept[:NAME_MAX_CHARS] or fallback


def attachment(name: str) -> str:
    """A ``Content-Disposition`` value for downloading ``name``, whatever its characters."""
    safe = stored_name(name, "download")
    ascii_name = "".join(
        char if " " <= char <= "~" and char not in '"\\%' else "_"
        for char in unicodedata.normalize("NFKD", safe)
        if not unicodedata.combining(char)
    )
    if ascii_name == safe:
        return f'attachment; filename="{ascii_name}"'
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(safe, safe='')}"

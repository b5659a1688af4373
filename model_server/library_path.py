"""The library path Triton's Python-backend stub needs.

The stub bundled with PyTriton links libpython dynamically; with a pyenv-style Python it
otherwise picks up the system's, and every model fails to load. The stub inherits the
server's environment, so the server must start with this interpreter's LIBDIR on
``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import sysconfig


def library_path(current: str, *first: str) -> str:
    """``current`` (an LD_LIBRARY_PATH value) with the folders ``first`` and this
    interpreter's libpython folder in front, each once."""
    wanted = [*first, str(sysconfig.get_config_var("LIBDIR") or "")]
    kept = [part for part in current.split(":") if part and part not in wanted]
    return ":".join(part for part in [*wanted, *kept] if part)

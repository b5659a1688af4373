"""Which of Brimful's source files a process runs between two signals (``scripts/task-path``).

Every Python process started with this folder first on ``PYTHONPATH`` loads it. On SIGUSR1
it starts counting, by file, the lines run in its main thread by functions whose path
starts with ``$TASK_PATH_ROOT``; on SIGUSR2 it stops and writes the counts to
``$TASK_PATH_DIR/<pid>.txt``, a file a line ("<lines> <path>"). Without both variables it
does nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from types import FrameType
from typing import Any

_ROOT = os.environ.get("TASK_PATH_ROOT", "")
_OUT = os.environ.get("TASK_PATH_DIR", "")
_calls: Counter[str] = Counter()


def _line(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "line":
        _calls[frame.f_code.co_filename] += 1
    return _line


def _note(frame: FrameType, event: str, arg: Any) -> Any:
    # Lines, not calls: a coroutine resumed only to pass a wake-up down its await runs
    # none of its own lines, and its file is not crossed.
    return _line if frame.f_code.co_filename.startswith(_ROOT) else None


def _start(signum: int, frame: FrameType | None) -> None:
    _calls.clear()
    sys.settrace(_note)


def _stop(signum: int, frame: FrameType | None) -> None:
    sys.settrace(None)
    with open(os.path.join(_OUT, f"{os.getpid()}.txt"), "w", encoding="utf-8") as out:
        out.write("".join(f"{count} {name}\n" for name, count in sorted(_calls.items())))


if _ROOT and _OUT:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)

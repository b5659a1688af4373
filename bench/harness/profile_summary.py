"""Reading a pyinstrument session: where a process's busy time goes."""

from __future__ import annotations

from typing import Any

IDLE_FILES = ("asyncio/runners.py", "asyncio/base_events.py", "selectors.py")


def top_self_time(session: Any, count: int = 15) -> tuple[list[tuple[str, float]], float]:
    """Functions by their share of the process's busy samples (time in the function itself,
    not in what it calls), and the share of all samples spent idle in the event loop."""
    totals: dict[str, float] = {}
    idle = 0.0
    frames = [session.root_frame()]
    while frames:
        frame = frames.pop()
        if (frame.file_path_short or "").startswith("<frozen importlib"):
            continue  # start-up imports: not the steady state being profiled
        frames.extend(frame.children)
        if frame.total_self_time <= 0:
            continue
        owner = frame.parent if frame.is_synthetic_leaf and frame.parent is not None else frame
        path = owner.file_path_short or ""
        if any(path.endswith(idle_file) for idle_file in IDLE_FILES):
            idle += frame.total_self_time
            continue
        where = f"{owner.function} ({path}:{owner.line_no})" if path else owner.function
        totals[where] = totals.get(where, 0.0) + frame.total_self_time
    busy = sum(totals.values()) or 1.0
    ranked = sorted(((k, v / busy) for k, v in totals.items()), key=lambda item: -item[1])[:count]
    return ranked, idle / (busy + idle)


def by_package(session: Any) -> list[tuple[str, float]]:
    """The busy samples grouped by where the code lives: Brimful, the web framework,
    redis, aiokafka, the standard library, ..."""
    groups: dict[str, float] = {}
    frames = [session.root_frame()]
    while frames:
        frame = frames.pop()
        path = frame.file_path_short or ""
        if path.startswith("<frozen importlib"):
            continue
        frames.extend(frame.children)
        owner = frame.parent if frame.is_synthetic_leaf and frame.parent is not None else frame
        path = owner.file_path_short or ""
        if frame.total_self_time <= 0 or any(path.endswith(idle_file) for idle_file in IDLE_FILES):
            continue
        head = path.split("/", 1)[0] if "/" in path else "(built-in or top level)"
        group = PACKAGE_GROUPS.get(head, "Brimful" if head in BRIMFUL_PACKAGES else "standard library and other")
        groups[group] = groups.get(group, 0.0) + frame.total_self_time
    whole = sum(groups.values()) or 1.0
    return sorted(((k, v / whole) for k, v in groups.items()), key=lambda item: -item[1])


BRIMFUL_PACKAGES = {"api", "batcher", "workers", "model_server", "core", "brimful", "schemas"}
PACKAGE_GROUPS = {
    "fastapi": "web framework (fastapi, starlette, uvicorn, pydantic)",
    "starlette": "web framework (fastapi, starlette, uvicorn, pydantic)",
    "uvicorn": "web framework (fastapi, starlette, uvicorn, pydantic)",
    "pydantic": "web framework (fastapi, starlette, uvicorn, pydantic)",
    "anyio": "web framework (fastapi, starlette, uvicorn, pydantic)",
    "redis": "redis client",
    "aiokafka": "Kafka client",
    "kafka": "Kafka client",
    "google": "protobuf",
    "tritonclient": "Triton client",
    "grpc": "Triton client",
    "asyncio": "asyncio",
    "json": "json",
}

"""What a batcher does once a tick beside batching: live policy changes applied to every
generation's service, its status published on the board (an entry a generation, which
expires with the batcher), and recorded arrivals flushed."""

from __future__ import annotations

import asyncio
import logging
import time

from brimful.batcher.generations import Generations
from brimful.batcher.service import BatcherService
from brimful.batcher.traces import ArrivalRecorder
from brimful.core.policy_tuning import PolicyTuning
from brimful.core.status_board import StatusBoard

log = logging.getLogger("brimful.batcher")


async def supervise(
    model: str,
    generations: Generations,
    tuning: PolicyTuning,
    board: StatusBoard,
    recorder: ArrivalRecorder | None,
    member: str,
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Apply live policy changes, publish this batcher's status (one entry a topic
    generation), flush recorded arrivals."""
    last_flush = time.monotonic()
    published: set[str] = set()
    while not stop.is_set():
        try:
            params = await tuning.params()
            entries: dict[str, tuple[int, BatcherService]] = {
                generations.member_name(member, number): (number, run.service)
                for number, run in generations.running.items()
            }
            for entry, (number, service) in entries.items():
                if params != service.params:
                    log.info("applying policy", extra={"old": vars(service.params), "new": vars(params)})
                    service.set_params(params)
                # "batcher" names the process: where topics rotate it has an entry a generation.
                await board.publish(
                    entry,
                    {
                        "model": model,
                        "batcher": member,
                        "generation": number,
                        **service.snapshot(),
                        "params": vars(service.params),
                    },
                    ttl_s=5 * interval_s + 2,
                )
            for gone in published - set(entries):
                await board.remove(gone)
            published = set(entries)
        except Exception as error:  # Redis away: keep batching with what we have
            log.warning("could not refresh policy or status", extra={"error": str(error)})
        if recorder is not None and time.monotonic() - last_flush >= 5.0:
            last_flush = time.monotonic()
            await flush_trace(recorder)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            pass
    if recorder is not None:
        await flush_trace(recorder)
    try:
        for entry in published | {member}:
            await board.remove(entry)
    except Exception as error:
        log.warning("could not leave the status board", extra={"error": str(error)})


async def flush_trace(recorder: ArrivalRecorder) -> None:
    """Write recorded arrivals out; a failure (a full disk, a bad trace_dir) costs the
    trace, never live tuning or the status board."""
    try:
        await asyncio.to_thread(recorder.flush)
    except Exception as error:
        log.warning("could not write the arrival trace", extra={"error": repr(error)})

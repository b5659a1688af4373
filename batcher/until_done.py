"""Running a batch's work until it completes, whatever it meets on the way."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from brimful.workers.retry_policy import BatchRetryPolicy

log = logging.getLogger("brimful.batcher")


async def until_done(
    batch_id: str,
    work: Callable[[], Awaitable[object]],
    give_up: Callable[[BaseException], Awaitable[object]],
    retry: BatchRetryPolicy,
    give_up_retry_s: float,
) -> None:
    """Run ``work`` until it completes: through an outage of Redis or the broker by waiting
    it out (its offsets stay uncommitted and repeating it is safe), and past a fault that
    repeating will not mend by ``give_up`` (failing its tasks to the DLQ; retried every
    ``give_up_retry_s``), so no batch can hold its partition for ever."""
    failures = 0
    while True:
        try:
            await work()
            return
        except asyncio.CancelledError:
            raise
        except Exception as error:
            failures += 1
            delay = retry.after_run_failure(error, failures)
            if delay is None:
                log.exception("batch keeps failing; giving it up to the DLQ", extra={"batch_id": batch_id})
                work, delay = functools.partial(give_up, error), give_up_retry_s
            else:
                log.exception("batch could not be finished; retrying", extra={"batch_id": batch_id})
            await asyncio.sleep(delay)

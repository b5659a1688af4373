"""A shutdown step is bounded: one that overruns, fails or ignores its cancellation is
logged and left behind, and the stop goes on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from brimful.core.shutdown_step import bounded_step


async def test_a_step_that_finishes_in_time_counts_as_done() -> None:
    finished = asyncio.Event()

    async def close() -> None:
        finished.set()

    assert await bounded_step("quick", close(), timeout_s=5) is True
    assert finished.is_set()


async def test_a_step_that_overruns_is_abandoned_and_cancelled(caplog: pytest.LogCaptureFixture) -> None:
    cancelled = asyncio.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with caplog.at_level(logging.WARNING, logger="brimful.shutdown"):
        assert await bounded_step("stuck", hang(), timeout_s=0.05) is False
    await asyncio.wait_for(cancelled.wait(), timeout=5)
    assert [record.step for record in caplog.records] == ["stuck"]  # type: ignore[attr-defined]


async def test_a_step_that_ignores_its_cancellation_does_not_hold_the_stop() -> None:
    release = asyncio.Event()
    ignored = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                ignored.set()  # swallowed, as a buggy client library might

    step = asyncio.ensure_future(stubborn())
    assert await bounded_step("stubborn", step, timeout_s=0.05) is False
    await asyncio.wait_for(ignored.wait(), timeout=5)
    assert not step.done()  # still running: the stop did not wait for it
    release.set()
    await asyncio.wait_for(step, timeout=5)


async def test_a_step_that_fails_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ConnectionError("broker gone")

    with caplog.at_level(logging.WARNING, logger="brimful.shutdown"):
        assert await bounded_step("producer", broken(), timeout_s=5) is False
    assert "broker gone" in caplog.records[0].error  # type: ignore[attr-defined]

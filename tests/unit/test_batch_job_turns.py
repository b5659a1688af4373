"""The order a driver steps batch jobs in: one tenant's many jobs never hold back another
tenant's job, and a job not stepped lately goes before one that was."""

from __future__ import annotations

import asyncio

from brimful.api.jobs.job_driver import _Cursor, _next_line
from brimful.core.batch_job_turns import turns


def test_a_new_tenants_job_is_stepped_before_a_busy_tenants_second() -> None:
    busy = [f"busy-{n}" for n in range(100)]
    jobs = [*busy, "newcomer"]  # oldest first: the newcomer's job is the 101st
    tenants = {**dict.fromkeys(busy, "busy"), "newcomer": "quiet"}
    order = turns(jobs, tenants, {})
    assert order.index("newcomer") <= 1
    assert sorted(order) == sorted(jobs)  # every job, once


def test_jobs_stepped_lately_go_to_the_back_so_every_job_comes_round() -> None:
    jobs = [f"job-{n}" for n in range(6)]
    tenants = dict.fromkeys(jobs, "one")
    stepped: dict[str, float] = {}
    seen: list[str] = []
    for clock in range(6):  # a look with room for one step each time
        first = turns(jobs, tenants, stepped)[0]
        stepped[first] = float(clock)
        seen.append(first)
    assert sorted(seen) == jobs  # six looks, six different jobs


def test_tenants_take_turns_and_an_unknown_tenant_is_its_own() -> None:
    jobs = ["a1", "a2", "a3", "b1", "c1", "c2"]
    tenants = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "c1": "c", "c2": "c"}  # "lost" not among them
    order = turns([*jobs, "lost"], tenants, {"a1": 5.0})
    assert order[:4] == ["a2", "b1", "c1", "lost"]  # a's job stepped lately waits its turn
    assert order[4:] == ["a3", "c2", "a1"]


def test_lines_given_back_are_read_again_first_and_their_ids_not_seen() -> None:
    async def stream() -> object:
        for line in (b"one", b"two", b"three"):
            yield line

    async def scenario() -> list[bytes | None]:
        cursor = _Cursor(stream())  # type: ignore[arg-type]
        read = [await _next_line(cursor), await _next_line(cursor)]
        cursor.seen.update({"id-1", "id-2"})
        cursor.give_back(read, ["id-2"])  # refused: both lines again, the second's id unseen
        assert cursor.position == 0 and cursor.seen == {"id-1"}
        return [await _next_line(cursor) for _ in range(4)]

    assert asyncio.run(scenario()) == [b"one", b"two", b"three", None]

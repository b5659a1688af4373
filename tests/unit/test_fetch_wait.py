"""The fetch wait: doubled while lagging with nothing fetched, kept while catching up,
back to its base once caught up."""

import pytest

from brimful.core.fetch_wait import FetchWait


def test_empty_fetches_while_lagging_double_the_wait_up_to_its_ceiling() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    waits = [wait.after_fetch(got_records=False, lagging=True) for _ in range(10)]
    assert waits == [40, 80, 160, 320, 640, 1280, 2560, 4000, 4000, 4000]


def test_records_while_still_lagging_keep_the_wait_and_catching_up_resets_it() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    for _ in range(4):
        wait.after_fetch(got_records=False, lagging=True)
    assert wait.after_fetch(got_records=True, lagging=True) == 320
    assert wait.after_fetch(got_records=True, lagging=False) == 20


def test_an_idle_consumer_keeps_its_base_wait() -> None:
    wait = FetchWait(base_ms=20, ceiling_ms=4000)
    assert [wait.after_fetch(got_records=False, lagging=False) for _ in range(3)] == [20, 20, 20]


def test_a_zero_base_still_grows() -> None:
    wait = FetchWait(base_ms=0, ceiling_ms=100)
    assert [wait.after_fetch(got_records=False, lagging=True) for _ in range(3)] == [1, 2, 4]


def test_a_ceiling_below_the_base_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        FetchWait(base_ms=500, ceiling_ms=100)

"""Topic generations: which topic a send goes to, which generations a batcher consumes,
and when one may be retired, on wall-clock seconds passed in."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from brimful.core.settings import Settings
from brimful.core.topic_generations import TopicGenerations

ROTATING = TopicGenerations("brimful.requests", period_s=10.0, lead_s=5.0, grace_s=30.0)


def test_without_rotation_there_is_one_topic_named_as_before() -> None:
    one = TopicGenerations("brimful.requests")
    assert {one.topic_at(now) for now in (0.0, 1e9, 2e9)} == {"brimful.requests"}
    assert one.generation_of("brimful.requests") == 0
    assert one.generation_of("brimful.requests.g5") is None
    assert one.live(1e9) == {0}
    assert one.older(1e9, ["brimful.requests", "brimful.requests.g5"]) == set()
    assert not one.may_retire(0, 1e12)
    settings = Settings()
    assert settings.consumer_group_for(settings.default_model, 7) == settings.consumer_group


def test_every_sender_picks_the_generation_of_its_clock() -> None:
    assert ROTATING.topic_at(1000.0) == ROTATING.topic_at(1009.999) == "brimful.requests.g100"
    assert ROTATING.topic_at(1010.0) == "brimful.requests.g101"
    assert ROTATING.ends_at(100) == 1010.0


def test_only_the_models_own_generations_are_recognised() -> None:
    assert ROTATING.generation_of("brimful.requests.g100") == 100
    # Another model's topic shares the prefix; a generation of it is not this model's.
    for other in ("brimful.requests", "brimful.requests.small", "brimful.requests.small.g100", "brimful.requests.g1x"):
        assert ROTATING.generation_of(other) is None


def test_a_producer_needs_the_generations_a_send_may_still_reach_and_the_next_within_the_lead() -> None:
    # At 1012 s: g100 ended 2 s ago, within a 10 s request; g101 is current; g102 starts at
    # 1020, beyond the 5 s lead.
    assert ROTATING.in_use(1012.0, in_flight_s=10.0) == ["brimful.requests.g100", "brimful.requests.g101"]
    # At 1021 s g100 ended 11 s ago: no send to it is under way, so it is no longer asked for.
    assert ROTATING.in_use(1021.0, in_flight_s=10.0) == ["brimful.requests.g101", "brimful.requests.g102"]
    assert ROTATING.in_use(1016.0, in_flight_s=1.0) == ["brimful.requests.g101", "brimful.requests.g102"]
    # It stops asking before the batchers may delete it (a grace past its end).
    ended = ROTATING.ends_at(100)
    assert "brimful.requests.g100" not in ROTATING.in_use(ended + 10.0, in_flight_s=10.0)
    assert not ROTATING.may_retire(100, ended + 10.0)
    assert TopicGenerations("brimful.requests").in_use(1e9, in_flight_s=10.0) == ["brimful.requests"]


def test_the_live_generations_take_the_next_within_the_lead_and_older_ones_are_those_that_exist() -> None:
    assert ROTATING.live(1000.0) == {100}
    assert ROTATING.live(1005.0) == {100, 101}  # 5 s before generation 101 starts
    existing = ["brimful.requests.g97", "brimful.requests.g99", "brimful.requests.g100", "brimful.requests.small.g98"]
    assert ROTATING.older(1000.0, [*existing, "brimful.dlq"]) == {97, 99}
    assert ROTATING.upcoming(1006.0) == ["brimful.requests.g100", "brimful.requests.g101"]


def test_a_generation_may_be_retired_only_past_its_end_by_the_grace() -> None:
    assert not ROTATING.may_retire(100, 1010.0)  # just ended: a send begun before may still land
    assert not ROTATING.may_retire(100, 1039.9)
    assert ROTATING.may_retire(100, 1040.0)


@pytest.mark.parametrize(
    "values",
    [
        {"topic_rotation_s": 2.0},  # shorter than a group takes to form
        {"topic_rotation_s": 10.0, "topic_rotation_grace_s": 15.0},  # a 10 s send could outlive it
    ],
)
def test_settings_refuse_a_rotation_that_could_lose_a_send(values: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="topic_rotation"):
        Settings(**values)  # type: ignore[arg-type]


def test_a_rotating_models_generations_carry_its_settings() -> None:
    settings = Settings(topic_rotation_s=30.0, topic_rotation_grace_s=45.0, models="big,small", model_name="big")
    generations = settings.topic_generations_for("small")
    assert generations.topic_at(60.0) == "brimful.requests.small.g2"
    assert (generations.lead_s, generations.grace_s) == (10.0, 45.0)
    assert settings.consumer_group_for("small", 2) == "brimful-batchers.small.g2"

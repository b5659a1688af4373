"""Which models a Brimful serves, and the topic, consumer group and Redis keys each has:
the default model keeps the names of a Brimful serving one model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings


def test_without_models_the_one_model_served_is_model_name_with_the_single_model_names() -> None:
    settings = Settings(model_name="solo")
    assert settings.served_models == ["solo"] and settings.default_model == "solo"
    assert settings.requests_topic_for("solo") == settings.requests_topic
    assert settings.consumer_group_for("solo") == settings.consumer_group
    assert settings.model_scope("solo") is None


def test_another_model_has_a_topic_group_and_keys_of_its_own() -> None:
    settings = Settings(models="big, small", model_name="small")
    assert settings.served_models == ["big", "small"] and settings.default_model == "big"
    assert settings.requests_topic_for("big") == "brimful.requests"
    assert settings.requests_topic_for("small") == "brimful.requests.small"
    assert settings.consumer_group_for("small") == "brimful-batchers.small"
    keys = RedisKeys("p")
    scopes = [settings.model_scope(name) for name in settings.served_models]
    assert scopes == [None, "small"]
    for key in ("model_stats", "model_policy", "model_policy_history", "model_endpoint_down_channel"):
        default, other = (getattr(keys, key)(scope) for scope in scopes)
        assert default != other and "small" in other and "small" not in default
    assert keys.endpoint_slots("h:1", None) != keys.endpoint_slots("h:1", "small")
    # The policy and its history share a hash slot on a Redis Cluster, per model.
    assert keys.model_policy("small").startswith("{p:policy}") and keys.model_policy_history("small").startswith(
        "{p:policy}"
    )


@pytest.mark.parametrize(
    ("models", "model_name", "message"),
    [
        ("a,b,a", "a", "twice"),
        ("a,b c", "a", "is not 1-64"),
        ("a,b", "c", "not one of models"),  # a batcher would read another model's topic
        ("a," + "x" * 65, "a", "is not 1-64"),
    ],
)
def test_a_catalogue_brimful_cannot_serve_is_refused_at_start(models: str, model_name: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(models=models, model_name=model_name)

"""Which models the embedded stack serves, and which flags its model host gets for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from brimful.commands.up import EMBEDDED_MODELS, embedded_models, embedded_settings
from brimful.core.settings import Settings
from brimful.core.topic_generations import MEASURED_PERIOD_S
from brimful.model_server.minilm_model import MODEL_NAME as MINILM
from brimful.stack import EmbeddedStack
from brimful.stack.embedded import StackError


def test_minilm_joins_the_embedded_models_only_where_its_extra_is_installed() -> None:
    assert embedded_models(False) == EMBEDDED_MODELS
    assert embedded_models(True).split(",") == [*EMBEDDED_MODELS.split(","), MINILM]
    assert MINILM not in EMBEDDED_MODELS


def test_models_given_by_the_operator_are_kept() -> None:
    chosen = Settings(models="brimful_reference")
    assert embedded_settings(chosen, with_minilm=True).models == "brimful_reference"
    assert embedded_settings(Settings(), with_minilm=True).served_models == embedded_models(True).split(",")


def test_the_embedded_stack_rotates_its_topics_unless_told_otherwise() -> None:
    assert Settings().topic_rotation_s == 0  # Apache Kafka's default: its retention bounds the topic
    assert embedded_settings(Settings(), with_minilm=False).topic_rotation_s == MEASURED_PERIOD_S
    assert embedded_settings(Settings(topic_rotation_s=0), with_minilm=False).topic_rotation_s == 0
    assert embedded_settings(Settings(topic_rotation_s=20), with_minilm=False).topic_rotation_s == 20


def test_on_kafka_the_embedded_stack_keeps_one_topic_and_the_brokers_session_defaults() -> None:
    on_kafka = embedded_settings(Settings(), with_minilm=False, on_kafka=True)
    assert on_kafka.topic_rotation_s == 0 and on_kafka.kafka_session_timeout_ms == Settings().kafka_session_timeout_ms
    assert on_kafka.served_models == EMBEDDED_MODELS.split(",")


def test_the_model_host_serves_minilm_beside_the_reference_model(tmp_path: Path) -> None:
    stack = EmbeddedStack(Settings(models=embedded_models(True)), tmp_path)
    assert stack.reference_sizes() == [16]  # the other models are flags, not sizes
    assert stack.beside_flags() == ["--embedding", "--minilm"]
    assert EmbeddedStack(Settings(models=EMBEDDED_MODELS), tmp_path).beside_flags() == ["--embedding"]
    with pytest.raises(StackError, match="brimful_minilm only, not other_model"):
        EmbeddedStack(Settings(models="brimful_reference,other_model"), tmp_path).reference_sizes()


def test_a_change_the_embedded_stack_makes_is_checked_as_a_start_would_check_it() -> None:
    # Valid alone, but the rotation the embedded stack adds needs a longer grace: refused
    # here, not by each child process later.
    short_grace = Settings(topic_rotation_grace_s=15)  # 10 s of request timeout + 10 needed
    with pytest.raises(ValueError, match="topic_rotation_grace_s"):
        embedded_settings(short_grace, with_minilm=False)
    # What the operator gave stays what was given: the stack places the file store beside
    # its data where none was given (EmbeddedStack.start reads model_fields_set).
    given = Settings(models="brimful_reference")
    changed = embedded_settings(given, with_minilm=False)
    assert changed.model_fields_set == given.model_fields_set | {"topic_rotation_s", "kafka_session_timeout_ms"}
    assert "file_store_url" not in changed.model_fields_set

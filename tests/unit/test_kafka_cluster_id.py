"""A KRaft cluster id never starts with "-": Kafka's storage tool would read it as an option."""

from __future__ import annotations

import uuid

from brimful.stack.kafka_cluster import new_cluster_id


def test_an_id_that_would_start_with_a_dash_is_drawn_again() -> None:
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))  # URL-safe base64 of 0b111110...: "-"
    plain = uuid.UUID(bytes=bytes(range(16)))
    draws = iter([dashed, plain])
    assert new_cluster_id(lambda: next(draws)) == "AAECAwQFBgcICQoLDA0ODw"


def test_ids_are_base64_of_a_uuid_without_padding() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(text) == 22 and not text.startswith("-") for text in ids)

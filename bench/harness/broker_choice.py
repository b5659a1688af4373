"""The broker a benchmark runs on: the embedded Tansu (``make up``'s), or Apache Kafka
itself, one KRaft node at the version the tests run, its jars from Maven Central."""

from __future__ import annotations

import argparse

from brimful.stack.kafka_jars import DEFAULT_KAFKA_VERSION

# A broker's name on the command line -> the Kafka version the stack starts (None: Tansu).
BROKERS: dict[str, str | None] = {"tansu": None, "kafka": DEFAULT_KAFKA_VERSION}


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        choices=list(BROKERS),
        default="tansu",
        help=f"the embedded Tansu or Apache Kafka {DEFAULT_KAFKA_VERSION} (one node)",
    )


def broker_label(broker: str) -> str:
    """How a report names the broker."""
    version = BROKERS[broker]
    return f"Apache Kafka {version} (one KRaft node)" if version else "the embedded Tansu (memory storage)"

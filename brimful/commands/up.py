"""``brimful up``: run the embedded stack on loopback until Ctrl-C or SIGTERM, starting
again any part of it that dies."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from brimful.core.settings import Settings, changed_settings, get_settings
from brimful.core.topic_generations import MEASURED_PERIOD_S
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING_MODEL
from brimful.model_server.minilm_model import MODEL_NAME as MINILM_MODEL
from brimful.model_server.minilm_model import minilm_installed
from brimful.model_server.model_host import fixed_name
from brimful.model_server.reference_model import MODEL_NAME
from brimful.stack import EmbeddedStack, StackError, Supervisor
from brimful.stack.kafka_jars import DEFAULT_KAFKA_VERSION, KAFKA_VERSIONS
from brimful.stack.stack_settings import TANSU_SESSION_TIMEOUT_MS


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("up", help="run the embedded stack on loopback until Ctrl-C")
    parser.add_argument("--workdir", default=".brimful", help="where logs and scratch data go (default: .brimful)")
    parser.add_argument("--echo-logs", action="store_true", help="print API and batcher logs here instead of to files")
    parser.add_argument("--auth", action="store_true", help="require API keys (made with `brimful keys create`)")
    parser.add_argument(
        "--kafka",
        nargs="?",
        const=DEFAULT_KAFKA_VERSION,
        choices=KAFKA_VERSIONS,
        help=f"Apache Kafka (one KRaft node; needs Java 17 and Maven) instead of Tansu; default {DEFAULT_KAFKA_VERSION}",
    )
    parser.set_defaults(handler=run)


# The reference model at 64 rows (the default model) and the same function fixed at 16.
REFERENCE_MODELS = f"{MODEL_NAME},{fixed_name(MODEL_NAME, 16)}"
# What the embedded stack serves unless BRIMFUL_MODELS says otherwise: those two, and the
# small embedding model behind POST /v1/embeddings.
EMBEDDED_MODELS = f"{REFERENCE_MODELS},{EMBEDDING_MODEL}"


def embedded_models(with_minilm: bool) -> str:
    """The embedded stack's models: MiniLM too where its extra is installed."""
    return f"{EMBEDDED_MODELS},{MINILM_MODEL}" if with_minilm else EMBEDDED_MODELS


def embedded_settings(settings: Settings, with_minilm: bool, on_kafka: bool = False) -> Settings:
    """The settings with the embedded stack's models, where neither BRIMFUL_MODELS nor
    another BRIMFUL_MODEL_NAME was given. On Tansu (not ``on_kafka``), also its requests
    topics rotating every ``MEASURED_PERIOD_S`` where BRIMFUL_TOPIC_ROTATION_S was not
    given (Tansu keeps every record, and its fetches slow as they pile up; Kafka's
    retention bounds a topic), and Tansu's short group session unless
    BRIMFUL_KAFKA_SESSION_TIMEOUT_MS was given."""
    changes: dict[str, object] = {}
    if "topic_rotation_s" not in settings.model_fields_set and not on_kafka:
        changes["topic_rotation_s"] = MEASURED_PERIOD_S
    if "kafka_session_timeout_ms" not in settings.model_fields_set and not on_kafka:
        changes["kafka_session_timeout_ms"] = TANSU_SESSION_TIMEOUT_MS
    if "models" not in settings.model_fields_set and settings.model_name == MODEL_NAME:
        changes["models"] = embedded_models(with_minilm)
    return changed_settings(settings, **changes)


def run(args: argparse.Namespace) -> int:
    settings = embedded_settings(get_settings(), minilm_installed(), on_kafka=args.kafka is not None)
    if not args.auth:
        settings = changed_settings(settings, auth_enabled=False)
        print(
            "brimful: WARNING: running OPEN: no API key is needed and every caller sees every task. "
            "For a local machine only; pass --auth to require keys.",
            file=sys.stderr,
        )
    stack = EmbeddedStack(settings, Path(args.workdir), echo_service_logs=args.echo_logs, kafka_version=args.kafka)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    started = time.monotonic()
    print(
        f"brimful: starting {'Apache Kafka ' + args.kafka if args.kafka else 'the Tansu broker'}, redis, triton, a batcher per model ({', '.join(settings.served_models)}) "
        "and api ...",
        file=sys.stderr,
    )
    try:
        stack.start()
    except StackError as error:
        print(f"brimful: start failed: {error}", file=sys.stderr)
        return 1
    print(
        f"brimful: ready in {time.monotonic() - started:.1f} s at {stack.api_url} "
        f"(POST /v1/tasks, GET /v1/tasks/{{id}}, /v1/stats, /readyz); logs in {args.workdir}/logs; Ctrl-C stops",
        file=sys.stderr,
    )
    # A child that dies is started again (the API keeps accepting while a batcher
    # restarts); the stack stops only when asked.
    supervisor = Supervisor(stack, say=lambda line: print(f"brimful: {line}", file=sys.stderr))
    while not stop.wait(0.5):
        supervisor.check()
    print("brimful: stopping ...", file=sys.stderr)
    stack.stop()
    print("brimful: stopped", file=sys.stderr)
    return 0

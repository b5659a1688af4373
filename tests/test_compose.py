"""docker-compose.yml cannot run here (no Docker engine), so it is checked statically:
every command names a real entry point, and ports and env agree with the settings."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from brimful.core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
IMAGE_ROOT = "/opt/brimful"  # WORKDIR of the Dockerfile


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def brimful_env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items() if k.startswith("BRIMFUL_")}


def batcher_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("command", [])[-1:] == ["brimful.batcher"]}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_every_service_is_there(compose: dict[str, Any]) -> None:
    always = {name for name, service in compose["services"].items() if not service.get("profiles")}
    assert always == {"kafka", "redis", "triton", "batcher", "batcher-reference-16", "api"}


def test_the_monitoring_profile_scrapes_every_process_and_provisions_the_dashboard(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name for name, s in services.items() if "monitoring" in s.get("profiles", [])} == {"prometheus", "grafana"}
    mounts = {
        volume.split(":")[1]: ROOT / volume.split(":")[0]
        for name in ("prometheus", "grafana")
        for volume in services[name]["volumes"]
        if volume.startswith("./")
    }
    for source in mounts.values():
        assert source.exists(), f"{source} is mounted but missing"
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    for rules in config["rule_files"]:  # resolved beside the config file, where it is mounted
        assert f"/etc/prometheus/{rules}" in mounts
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api_port = brimful_env(services["api"])["BRIMFUL_API_PORT"]
    assert jobs["brimful-api"]["static_configs"][0]["targets"] == [f"api:{api_port}"]
    batcher_sd = jobs["brimful-batcher"]["dns_sd_configs"][0]
    assert (
        set(batcher_sd["names"]) == set(batcher_services(compose))
        and batcher_sd["port"] == Settings().batcher_metrics_port
    )
    for name in batcher_sd["names"]:
        assert brimful_env(services[name])["BRIMFUL_BATCHER_METRICS_HOST"] == "0.0.0.0"
    dashboards = mounts["/var/lib/grafana/dashboards"]
    provider = yaml.safe_load((mounts["/etc/grafana/provisioning"] / "dashboards" / "brimful.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (dashboards / "brimful.json").exists()


def test_python_commands_name_real_entry_points(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        command = service.get("command") or []
        if command[:2] != ["python", "-m"]:
            continue
        module = command[2]
        assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        spec = importlib.util.find_spec(module)
        is_package = spec is not None and spec.submodule_search_locations is not None
        if is_package:
            assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{name}: {module} has no __main__"
        else:
            source = Path(spec.origin).read_text()  # type: ignore[union-attr, arg-type]
            assert 'if __name__ == "__main__":' in source, f"{name}: {module} does not run as a script"


def test_brimful_env_is_valid_settings(compose: dict[str, Any]) -> None:
    fields = set(Settings.model_fields)
    for name, service in compose["services"].items():
        env = brimful_env(service)
        for key in env:
            assert key.removeprefix("BRIMFUL_").lower() in fields, f"{name}: {key} is not a setting"
        if env:
            Settings(**{k.removeprefix("BRIMFUL_").lower(): v for k, v in env.items()})  # validates


def test_addresses_point_at_the_services_that_listen_there(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("api", "batcher"):
        env = brimful_env(services[name])
        kafka_host, kafka_port = env["BRIMFUL_KAFKA_BOOTSTRAP"].split(":")
        advertised = services[kafka_host]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        assert f"//{kafka_host}:{kafka_port}" in advertised
        redis = urlparse(env["BRIMFUL_REDIS_URL"])
        assert redis.hostname in services and redis.port == 6379  # redis-server's default port
        assert "--port" not in services[redis.hostname]["command"]
        triton_host, triton_port = env["BRIMFUL_TRITON_URL"].split(":")
        assert flag(services[triton_host]["command"], "--grpc-port") == triton_port


def test_api_port_is_published_and_health_checked(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    env = brimful_env(api)
    assert env["BRIMFUL_API_HOST"] == "0.0.0.0"
    container_ports = [str(p).split(":")[-1] for p in api["ports"]]
    assert env["BRIMFUL_API_PORT"] in container_ports
    assert f"127.0.0.1:{env['BRIMFUL_API_PORT']}/readyz" in " ".join(api["healthcheck"]["test"])


def test_triton_serves_each_model_a_batcher_batches_at_a_fixed_size(compose: dict[str, Any]) -> None:
    triton = compose["services"]["triton"]
    repository = flag(triton["command"], "--model-repository")
    assert repository.startswith(IMAGE_ROOT)
    local = ROOT / repository.removeprefix(IMAGE_ROOT + "/")
    health = " ".join(triton["healthcheck"]["test"])
    batched = {brimful_env(service)["BRIMFUL_MODEL_NAME"] for service in batcher_services(compose).values()}
    settings = Settings(
        **{k.removeprefix("BRIMFUL_").lower(): v for k, v in brimful_env(compose["services"]["api"]).items()}
    )
    assert batched == set(settings.served_models)  # every model served has its batchers
    for model in batched:
        config = (local / model / "config.pbtxt").read_text()
        assert re.search(rf'^name: "{model}"', config, re.M)
        assert re.search(r"^max_batch_size: 0$", config, re.M)  # batching off: shapes are exact
        dims = set(re.findall(r"dims: \[ (\d+), 1 \]", config))
        assert len(dims) == 1, f"{model}: every tensor fixed at one row count"
        if model == settings.default_model:  # the one BRIMFUL_BATCH_SIZE describes
            assert dims == {str(settings.batch_size)}
        assert (local / model / "1" / "model.py").exists()
        assert f"'{model}'" in health and f"{flag(triton['command'], '--http-port')}/v2/models/" in health


def test_dockerfile_copies_every_package(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for folder in folders:
        assert f"COPY {folder} ./{folder}" in dockerfile
    assert "COPY deploy ./deploy" in dockerfile
    workdirs = re.findall(r"^WORKDIR (\S+)$", dockerfile, re.M)
    assert workdirs[0] == IMAGE_ROOT
    # From the source folder, `python -m brimful.api` would find brimful/ before the installed package.
    assert workdirs[-1] != IMAGE_ROOT

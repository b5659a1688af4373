"""The Helm chart (deploy/helm/brimful): rendered by the real `helm`, with the default and
the example values, every object validated against the Kubernetes API schemas (strict:
an unknown field fails) and KEDA's; and what it renders agrees with Brimful's settings.
No cluster runs here, so this is as far as the chart is checked (docs/operations.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda

from brimful.core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "brimful"
EXAMPLE = ROOT / "deploy" / "helm" / "examples" / "production.yaml"
# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest schema at hand.
KUBERNETES_VERSIONS = ("1.26.0", kubernetes_validate.latest_version())
KEDA_KINDS = {"ScaledObject": keda.ScaledObject, "TriggerAuthentication": keda.TriggerAuthentication}

Manifest = dict[str, Any]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("helm") or str(ROOT / ".venv" / "bin" / "helm")
    assert Path(binary).exists(), "helm is missing: scripts/bootstrap installs it into .venv/bin"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


def render(*values: str, **overrides: object) -> list[Manifest]:
    args = ["template", "demo", str(CHART)]
    for file in values:
        args += ["-f", file]
    for key, value in overrides.items():
        args += ["--set", f"{key.replace('__', '.')}={value}"]
    rendered = helm(*args)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def by_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    return [doc for doc in docs if doc["kind"] == kind]


def deployment(docs: list[Manifest], component: str) -> Manifest:
    (found,) = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def container_env(doc: Manifest) -> dict[str, Any]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


@pytest.fixture(scope="module", params=["default", "example"])
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    return render() if request.param == "default" else render(str(EXAMPLE))


def test_helm_lint_passes_with_default_and_example_values() -> None:
    for values in ((), ("-f", str(EXAMPLE))):
        linted = helm("lint", "--strict", str(CHART), *values)
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_every_object_is_valid_for_kubernetes_and_keda(rendered: list[Manifest]) -> None:
    kinds = {doc["kind"] for doc in rendered}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ScaledObject"} <= kinds
    for doc in rendered:
        model = KEDA_KINDS.get(doc["kind"])
        if model is None:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
        else:
            assert doc["apiVersion"] == "keda.sh/v1alpha1"
            parsed = model.model_validate(doc)
            # The models ignore unknown fields: a field KEDA does not know is lost on the way back.
            assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, doc["kind"]


def test_every_brimful_variable_the_chart_sets_is_a_setting(rendered: list[Manifest]) -> None:
    known = {f"BRIMFUL_{name.upper()}" for name in Settings.model_fields}
    for component in ("api", "batcher"):
        names = {name for name in container_env(deployment(rendered, component)) if name.startswith("BRIMFUL_")}
        assert names and names <= known, f"{component}: not settings: {sorted(names - known)}"


def test_the_probes_ask_the_endpoints_each_process_serves(rendered: list[Manifest]) -> None:
    api = deployment(rendered, "api")["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    batcher_doc = deployment(rendered, "batcher")
    batcher = batcher_doc["spec"]["template"]["spec"]["containers"][0]
    env = container_env(batcher_doc)
    (port,) = batcher["ports"]
    assert port["containerPort"] == int(env["BRIMFUL_BATCHER_METRICS_PORT"])
    assert env["BRIMFUL_BATCHER_METRICS_HOST"] == "0.0.0.0"  # reachable by the kubelet and Prometheus
    assert batcher["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert batcher["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}


def test_pods_run_as_non_root_on_a_read_only_root_with_a_writable_tmp(rendered: list[Manifest]) -> None:
    for component in ("api", "batcher"):
        spec = deployment(rendered, component)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        container = spec["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"]


def test_selectors_match_the_pods_they_serve(rendered: list[Manifest]) -> None:
    pods = {c: deployment(rendered, c)["spec"]["template"]["metadata"]["labels"] for c in ("api", "batcher")}
    for doc in by_kind(rendered, "PodDisruptionBudget") + by_kind(rendered, "Deployment"):
        selector = doc["spec"]["selector"]["matchLabels"]
        assert any(selector.items() <= labels.items() for labels in pods.values()), doc["metadata"]["name"]
    (service,) = [s for s in by_kind(rendered, "Service") if s["metadata"]["name"].endswith("-api")]
    assert service["spec"]["selector"].items() <= pods["api"].items()
    (hpa,) = by_kind(rendered, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment(rendered, "api")["metadata"]["name"]


def test_keda_scales_the_batchers_on_their_own_group_and_topic_within_the_partitions(rendered: list[Manifest]) -> None:
    (scaled,) = by_kind(rendered, "ScaledObject")
    batchers = deployment(rendered, "batcher")
    assert "replicas" not in batchers["spec"]  # KEDA owns the count
    assert scaled["spec"]["scaleTargetRef"]["name"] == batchers["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    defaults = Settings()
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == defaults.consumer_group
    assert trigger["metadata"]["topic"] == defaults.requests_topic
    assert trigger["metadata"]["bootstrapServers"] == container_env(batchers)["BRIMFUL_KAFKA_BOOTSTRAP"]
    assert trigger["metadata"]["allowIdleConsumers"] == "false"
    assert scaled["spec"]["maxReplicaCount"] <= int(container_env(batchers)["BRIMFUL_TOPIC_PARTITIONS"])


def test_more_batchers_than_partitions_is_refused() -> None:
    refused = helm(
        "template", "demo", str(CHART), "--set", "kafka.partitions=4", "--set", "batcher.keda.maxReplicaCount=5"
    )
    assert refused.returncode != 0
    assert "exceeds kafka.partitions" in refused.stderr


def test_credentials_come_from_secrets_never_plain_values() -> None:
    docs = render(str(EXAMPLE))
    for component in ("api", "batcher"):
        env = container_env(deployment(docs, component))
        for name in ("BRIMFUL_REDIS_URL", "BRIMFUL_KAFKA_SASL_PASSWORD", "BRIMFUL_API_KEY"):
            assert "secretKeyRef" in env[name], f"{component}: {name} is not read from a Secret"
        assert env["BRIMFUL_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert env["BRIMFUL_KAFKA_SSL_CAFILE"].startswith("/etc/brimful/kafka-tls/")
    (auth,) = by_kind(docs, "TriggerAuthentication")
    assert {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]} == {"username", "password", "ca"}
    (secret,) = by_kind(docs, "Secret")
    assert "BRIMFUL" not in str(secret) and "password" not in secret.get("stringData", {})


def test_a_headless_service_over_the_triton_pods_becomes_the_worker_pool() -> None:
    docs = render(str(EXAMPLE))
    (models,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-models")]
    assert models["spec"]["clusterIP"] == "None"
    env = container_env(deployment(docs, "batcher"))
    assert env["BRIMFUL_TRITON_URL"] == f"{models['metadata']['name']}:{models['spec']['ports'][0]['port']}"
    assert env["BRIMFUL_TRITON_RESOLVE_DNS"] == "true"


def test_each_model_served_gets_its_own_batchers_scaled_on_its_own_topic() -> None:
    docs = render(model__others="{brimful_reference_16}")
    defaults = Settings(models="brimful_reference,brimful_reference_16")
    api_env = container_env(deployment(docs, "api"))
    assert api_env["BRIMFUL_MODELS"] == "brimful_reference,brimful_reference_16"
    assert api_env["BRIMFUL_MODEL_NAME"] == "brimful_reference"  # the default
    scaled = {doc["spec"]["scaleTargetRef"]["name"]: doc for doc in by_kind(docs, "ScaledObject")}
    budgets = {
        doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for doc in by_kind(docs, "PodDisruptionBudget")
    }
    for component, model in (
        ("batcher", "brimful_reference"),
        ("batcher-brimful-reference-16", "brimful_reference_16"),
    ):
        batchers = deployment(docs, component)
        env = container_env(batchers)
        assert env["BRIMFUL_MODEL_NAME"] == model and env["BRIMFUL_MODELS"] == api_env["BRIMFUL_MODELS"]
        # What the batcher reads is what KEDA watches.
        (trigger,) = scaled[batchers["metadata"]["name"]]["spec"]["triggers"]
        assert trigger["metadata"]["topic"] == defaults.requests_topic_for(model)
        assert trigger["metadata"]["consumerGroup"] == defaults.consumer_group_for(model)
        assert component in budgets
    # Selectors never overlap: the default model's batchers select none of the other's pods.
    default_selector = deployment(docs, "batcher")["spec"]["selector"]["matchLabels"]
    other_pods = deployment(docs, "batcher-brimful-reference-16")["spec"]["template"]["metadata"]["labels"]
    assert not default_selector.items() <= other_pods.items()
    for doc in docs:
        if doc["kind"] not in KEDA_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


def test_two_models_whose_kubernetes_names_collide_are_refused() -> None:
    for others in ("{brimful_reference}", "{a_b,a.b}"):
        refused = helm("template", "demo", str(CHART), "--set", f"model.others={others}")
        assert refused.returncode != 0 and "name the same model twice" in refused.stderr, others


def test_a_model_name_with_odd_ends_still_gives_valid_objects() -> None:
    # Settings allow [A-Za-z0-9._-]{1,64}; Kubernetes names and label values are stricter.
    name = "." + "x_y" * 20 + "ab-"  # 64 characters, a dot first and a dash last
    docs = render(model__others="{" + name + "}")
    assert len(by_kind(docs, "Deployment")) == 3  # the API and two models' batchers
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    dns_name = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63 and dns_name.match(doc["metadata"]["name"]), doc["metadata"]["name"]
        labels = [doc["metadata"].get("labels", {})]
        if doc["kind"] == "Deployment":
            labels.append(doc["spec"]["template"]["metadata"]["labels"])
        for value in (v for found in labels for v in found.values()):
            assert len(value) <= 63 and label_value.match(value), value
        if doc["kind"] not in KEDA_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)

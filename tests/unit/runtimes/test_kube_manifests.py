"""deploy/kubernetes/: every manifest parses and names what it must; the Role grants exactly
what the kubernetes runtime uses; the ConfigMap's models.yaml loads with the Deployment's env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import KubernetesRuntimeConfig, load_settings

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
NAMESPACE = "llm"
EXPECTED_RULES = {
    ("apps", "deployments"): {"get", "list", "watch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},
    ("apps", "deployments/scale"): {"get", "patch"},
    ("apps", "statefulsets/scale"): {"get", "patch"},
    ("discovery.k8s.io", "endpointslices"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "events"): {"get", "list", "watch"},
    ("", "pods/log"): {"get"},  # the backends' output (GET /backends/{name}/logs)
}


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_every_manifest_names_its_api_kind_name_and_namespace() -> None:
    docs = manifests()
    assert {d["kind"] for d in docs} >= {
        "Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment",
        "Service", "Secret",
    }  # fmt: skip
    for doc in docs:
        assert doc["apiVersion"], doc
        assert doc["metadata"]["name"], doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]


def test_the_role_grants_exactly_what_the_runtime_uses() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in one("Role", "microscheduler")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == EXPECTED_RULES
    binding = one("RoleBinding", "microscheduler")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "microscheduler"
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "microscheduler", "namespace": NAMESPACE}
    ]


def test_one_gateway_with_its_service_account() -> None:
    gateway = one("Deployment", "microscheduler")
    assert gateway["spec"]["replicas"] == 1
    pod = gateway["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "microscheduler"
    assert one("Service", "microscheduler")["spec"]["selector"] == {"app": "microscheduler"}


def test_the_example_model_needs_a_gpu_and_is_ready_by_health() -> None:
    vllm = one("Deployment", "vllm-qwen")
    assert vllm["spec"]["replicas"] == 0  # the gateway scales it up on demand
    pod = vllm["spec"]["template"]["spec"]
    assert pod["nodeSelector"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert (
        one("Service", "vllm-qwen")["spec"]["selector"] == vllm["spec"]["selector"]["matchLabels"]
    )


def test_the_configmap_models_yaml_loads_with_the_gateway_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models.yaml").write_text(
        one("ConfigMap", "microscheduler-config")["data"]["models.yaml"]
    )
    container = one("Deployment", "microscheduler")["spec"]["template"]["spec"]["containers"][0]
    for var in container["env"]:
        if "value" in var:
            monkeypatch.setenv(var["name"], var["value"])
    secret = one("Secret", "microscheduler-keys")["stringData"]["api-keys"]
    monkeypatch.setenv("MICROSCHEDULER_API_KEYS", secret)
    monkeypatch.setenv("MICROSCHEDULER_STATE_DIR", str(tmp_path / "var"))
    settings = load_settings(tmp_path)
    assert settings.host == "0.0.0.0"
    runtimes = [b.runtime for b in settings.backends.values()]
    assert runtimes
    for runtime in runtimes:
        assert isinstance(runtime, KubernetesRuntimeConfig)
        assert runtime.namespace == NAMESPACE
        one("Deployment", runtime.name)  # the workload it scales is in the manifests
        one("Service", runtime.service_name)


def test_the_example_models_caches_outlive_its_pods() -> None:
    """Each scale-up from 0 is a new pod: its Hugging Face and vLLM compile caches sit on
    a claim (`app.runtimes.cache_dirs`: /root/.cache/huggingface, /root/.cache/vllm)."""
    pod = one("Deployment", "vllm-qwen")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert set(mounted) == {"/root/.cache/huggingface", "/root/.cache/vllm"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes[mounted["/root/.cache/vllm"]]["persistentVolumeClaim"]["claimName"]
    assert one("PersistentVolumeClaim", claim)["spec"]["accessModes"]

"""Kubernetes settings, kubeconfig parsing and in-cluster credentials, and how the API's
`Status` failures read for the operator."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest
import respx
import yaml
from pydantic import ValidationError

from app.runtimes.kube_api import Call, KubeApi, KubeError
from app.runtimes.kube_config import KubeConfigError, from_kubeconfig, in_cluster, load_connection
from app.settings import BackendConfig, KubernetesConfig, Settings


def kubeconfig(tmp_path: Path, user: dict[str, Any], **cluster: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpu",
        "contexts": [
            {"name": "other", "context": {"cluster": "nope", "user": "nope"}},
            {"name": "gpu", "context": {"cluster": "c1", "user": "u1", "namespace": "llm"}},
        ],
        "clusters": [{"name": "c1", "cluster": {"server": "http://10.1.2.3:6443/", **cluster}}],
        "users": [{"name": "u1", "user": user}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_runtime_config_needs_exactly_one_workload() -> None:
    base = {"url": "http://vllm.llm:8000", "models": ["m"]}
    cfg = BackendConfig(**base, runtime={"kind": "kubernetes", "namespace": "llm",
                                          "statefulset": "vllm-a"})  # fmt: skip
    assert cfg.runtime.kind == "kubernetes"
    assert (cfg.runtime.resource, cfg.runtime.name, cfg.runtime.service_name) == (
        "statefulsets",
        "vllm-a",
        "vllm-a",
    )
    for workload in ({}, {"deployment": "a", "statefulset": "b"}):
        with pytest.raises(ValidationError, match="exactly one of deployment"):
            BackendConfig(**base, runtime={"kind": "kubernetes", "namespace": "llm", **workload})
    lazy = BackendConfig(**base, lifecycle="lazy",
                         runtime={"kind": "kubernetes", "namespace": "llm", "deployment": "d",
                                  "service": "svc"})  # fmt: skip
    assert lazy.runtime.kind == "kubernetes"
    assert lazy.runtime.service_name == "svc"


def test_scale_external_refuses_what_only_a_gateway_that_scales_could_do() -> None:
    runtime = {"kind": "kubernetes", "namespace": "llm", "deployment": "d", "scale": "external"}
    base = {"url": "http://vllm.llm:8000", "models": ["m"], "runtime": runtime}
    assert BackendConfig(**base).runtime.scale == "external"  # type: ignore[union-attr]
    pinned = BackendConfig(**base, lifecycle="pinned")  # started or adopted once it is ready
    assert not pinned.gpus_accounted  # the cluster's scheduler places it: not admitted
    gateway = {**runtime, "scale": "gateway"}
    assert BackendConfig(**{**base, "runtime": gateway}, idle_ttl_s=900).idle_ttl_s == 900
    with pytest.raises(ValidationError) as info:
        BackendConfig(**base, lifecycle="lazy", idle_ttl_s=900)
    assert (
        "idle_ttl_s: 900 with runtime.scale: external: the gateway does not scale it down, "
        "its owner (KEDA/HPA) does when it is idle (its cooldown); remove idle_ttl_s"
    ) in str(info.value)
    with pytest.raises(ValidationError) as info:
        BackendConfig(**base, host="node-c", vram_mib=20000)
    assert (
        "host: node-c with runtime.scale: external: admission on that host's GPUs could not "
        "evict it or free its memory, since the gateway does not scale it (remove host:, so "
        "the cluster's scheduler places it, or use scale: gateway)"
    ) in str(info.value)
    with pytest.raises(ValidationError, match="scale"):
        BackendConfig(**{**base, "runtime": {**runtime, "scale": "keda"}})


def test_kubernetes_section_validates_the_api_url() -> None:
    backends = {"a": {"url": "http://a:8000", "models": ["a"]}}
    assert Settings(backends=backends).kubernetes.kubeconfig is None
    with pytest.raises(ValidationError, match="kubectl proxy"):
        Settings(backends=backends, kubernetes={"api_url": "10.0.0.1:6443"})


def test_token_user_of_the_current_context(tmp_path: Path) -> None:
    connection = from_kubeconfig(kubeconfig(tmp_path, {"token": "abc"}))
    assert connection.server == "http://10.1.2.3:6443"
    assert connection.bearer() == "abc"
    assert "context 'gpu'" in connection.source


def test_token_file_is_relative_to_the_kubeconfig_and_reread(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("one\n")
    connection = from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "tok"}))
    assert connection.bearer() == "one"
    (tmp_path / "tok").write_text("two\n")
    assert connection.bearer() == "one"  # cached for a minute
    assert connection.bearer(reread=True) == "two"


def test_exec_plugins_are_refused_by_name(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"exec": {"command": "aws", "apiVersion": "v1"}})
    with pytest.raises(KubeConfigError, match=r"exec credential plugins .*\(exec:\)"):
        from_kubeconfig(path)


def test_missing_context_and_bad_ca_are_named(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc["current-context"] = "gone"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match="no context named 'gone'"):
        from_kubeconfig(path)
    bad = base64.b64encode(b"not a certificate").decode()
    path = kubeconfig(tmp_path, {"token": "t"}, server="https://k:6443")
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"] = {"server": "https://k:6443", "certificate-authority-data": bad}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match="the cluster's CA"):
        from_kubeconfig(path)


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"] = {"server": "https://k:6443", "insecure-skip-tls-verify": True}
    path.write_text(yaml.safe_dump(doc))
    assert from_kubeconfig(path).verify is False


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text(Path(certifi.where()).read_text())  # any PEM CA
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    connection = in_cluster(env, tmp_path)
    assert connection.server == "https://10.96.0.1:443"
    assert connection.bearer() == "sa-token"
    assert isinstance(connection.verify, ssl.SSLContext)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster({}, tmp_path)


def test_load_prefers_kubeconfig_then_env_then_api_url(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    assert load_connection(KubernetesConfig(), {"KUBECONFIG": str(path)}).bearer() == "t"
    proxied = load_connection(KubernetesConfig(kubeconfig=path, api_url="http://127.0.0.1:8001"))
    assert proxied.server == "http://127.0.0.1:8001"
    assert proxied.bearer() == "t"
    bare = load_connection(KubernetesConfig(api_url="http://127.0.0.1:8001"), {})
    assert bare.bearer() is None
    with pytest.raises(KubeConfigError, match="no Kubernetes API server configured"):
        load_connection(KubernetesConfig(), {})


FORBIDDEN = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'deployments.apps "vllm" is forbidden: User "system:serviceaccount:llm:gw" '
    'cannot patch resource "deployments/scale" in API group "apps" in the namespace "llm"',
    "reason": "Forbidden",
    "details": {"name": "vllm", "group": "apps", "kind": "deployments"},
    "code": 403,
}
PATCH = Call("patch", "deployments/scale", "llm", "vllm", group="apps")


async def failure(answer: httpx.Response, call: Call = PATCH) -> KubeError:
    api = KubeApi(KubernetesConfig(api_url="http://k8s"), env={})
    try:
        with respx.mock(base_url="http://k8s") as router:
            router.patch("/x").mock(return_value=answer)
            with pytest.raises(KubeError) as caught:
                await api.merge_patch("/x", {"spec": {"replicas": 1}}, call)
            assert router.calls.last.request.headers["content-type"] == (
                "application/merge-patch+json"
            )
    finally:
        await api.aclose()
    return caught.value


async def test_403_names_the_verb_resource_and_role() -> None:
    error = await failure(httpx.Response(403, json=FORBIDDEN))
    assert error.reason == "Forbidden"
    assert error.status == 403
    text = str(error)
    assert "may not patch deployments/scale in API group 'apps' in namespace 'llm'" in text
    assert "Role" in text
    assert 'cannot patch resource \\"deployments/scale\\"' not in text
    assert 'cannot patch resource "deployments/scale"' in text  # Kubernetes' words, quoted


async def test_404_401_and_others() -> None:
    not_found = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                 "message": 'deployments.apps "vllm" not found'}  # fmt: skip
    error = await failure(httpx.Response(404, json=not_found))
    assert "no deployments 'vllm' in namespace 'llm'" in str(error)
    unauthorized = {"kind": "Status", "status": "Failure", "message": "Unauthorized",
                    "reason": "Unauthorized", "code": 401}  # fmt: skip
    error = await failure(httpx.Response(401, json=unauthorized))
    assert "refused the credentials from kubernetes.api_url" in str(error)
    error = await failure(httpx.Response(502, text="bad gateway"))
    assert error.reason == "HTTP 502"
    assert "bad gateway" in str(error)


async def test_unreachable_names_the_settings() -> None:
    api = KubeApi(KubernetesConfig(api_url="http://127.0.0.1:1"), env={})
    try:
        with pytest.raises(KubeError, match=r"cannot reach .*kubernetes.kubeconfig") as caught:
            await api.get("/x", PATCH)
    finally:
        await api.aclose()
    assert caught.value.reason == "unreachable"


async def test_a_watch_answered_410_is_expired() -> None:
    """The API server may also refuse a watch outright with 410 Gone (not in the stream)."""
    gone = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version: 5 (9)"}  # fmt: skip
    api = KubeApi(KubernetesConfig(api_url="http://k8s"), env={})
    call = Call("watch", "endpointslices", "llm", group="discovery.k8s.io")
    try:
        with respx.mock(base_url="http://k8s") as router:
            router.get("/w").mock(return_value=httpx.Response(410, json=gone))
            with pytest.raises(KubeError) as caught:
                async for _ in api.watch("/w", call, {"resourceVersion": "5"}, 10):
                    pass
            params = router.calls.last.request.url.params
            assert (params["watch"], params["resourceVersion"]) == ("1", "5")
    finally:
        await api.aclose()
    assert caught.value.expired
    assert "too old resource version" in str(caught.value)

"""`hosts:` and a backend's `host:` in the settings: every refusal of `check_hosts` and
`HostConfig` says what is wrong and where, and `load_settings` names models.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.settings import BackendConfig, ConfigError, GpuConfig, Settings, load_settings
from app.settings.cloud import ProviderConfig
from app.settings.hosts import HostConfig, check_hosts

NODE_C: dict[str, Any] = {"docker": {"url": "http://node-c:2375"}, "gpu": {"probe": "sim"}}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def docker(host: str | None = None, **fields: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "url": "http://127.0.0.1:8001",
        "models": ["m"],
        "runtime": {"kind": "docker", "container": "vllm-m"},
        "vram_mib": 12000,
        **fields,
    }
    if host is not None:
        backend["host"] = host
    return backend


def kubernetes(**fields: Any) -> dict[str, Any]:
    return {
        "url": "http://127.0.0.1:8002",
        "models": ["k"],
        "runtime": {"kind": "kubernetes", "namespace": "llm", "deployment": "vllm-k"},
        "lifecycle": "lazy",
        **fields,
    }


def problem(hosts: dict[str, Any], backends: dict[str, dict[str, Any]]) -> str | None:
    return check_hosts(
        {name: HostConfig(**cfg) for name, cfg in hosts.items()},
        GpuConfig(probe="sim"),  # the local count below is a simulated GPU's
        {name: BackendConfig(**cfg) for name, cfg in backends.items()},
    )


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        Settings(**fields)
    return str(info.value)


def test_a_valid_host_and_its_backend_pass() -> None:
    assert problem({"node-c": NODE_C}, {"c": docker("node-c"), "a": docker()}) is None
    settings = Settings(hosts={"node-c": NODE_C}, backends={"c": docker("node-c")})
    assert settings.backends["c"].host_name == "node-c"
    assert settings.hosts["node-c"].docker is not None


def test_an_unknown_host_is_refused_naming_the_known_ones() -> None:
    found = problem({"node-c": NODE_C, "node-d": NODE_C}, {"x": docker("node-x")})
    assert found == "backends.x.host: no host 'node-x' in hosts: (known: local, node-c, node-d)"
    # Without any hosts: only the local one is known.
    assert problem({}, {"x": docker("node-c")}) == (
        "backends.x.host: no host 'node-c' in hosts: (known: local)"
    )


def test_local_is_not_a_name_for_another_host() -> None:
    found = problem({"local": NODE_C}, {})
    assert found is not None
    assert found.startswith("hosts.local: 'local' is the gateway's own machine")
    assert "give the other machine another name" in found


@pytest.mark.parametrize("name", ["-node", "node c", "a" * 65, "node/c", "", "Node-C"])
def test_a_bad_host_name_is_refused(name: str) -> None:
    found = problem({name: NODE_C}, {})
    assert found == (
        f"hosts.{name}: a host name is 1 to 64 lowercase letters, digits, '_', '.' "
        "or '-', starting with a letter or digit"
    )


def test_a_process_runtime_runs_only_on_the_gateways_machine() -> None:
    backend = docker("node-c", runtime={"kind": "process", "command": ["vllm", "serve"]})
    found = problem({"node-c": NODE_C}, {"p": backend})
    assert found is not None
    assert found.startswith("backends.p.host: node-c: a process runtime runs on the gateway's")
    assert "needs runtime docker" in found
    # On the local host the same backend is fine.
    local = docker(runtime={"kind": "process", "command": ["vllm", "serve"]})
    assert problem({"node-c": NODE_C}, {"p": local}) is None


def test_a_docker_backend_needs_its_hosts_docker() -> None:
    found = problem({"node-c": {"gpu": {"probe": "sim"}}}, {"c": docker("node-c")})
    assert found == (
        "backends.c.runtime: docker on host 'node-c', which has no docker: "
        "(add hosts.node-c.docker.url, its Docker socket proxy)"
    )
    # A host without docker: may still run kubernetes or external backends.
    external = docker("node-c", runtime={"kind": "external"})
    assert problem({"node-c": {"gpu": {"probe": "sim"}}}, {"e": external}) is None


def test_probe_nvml_is_refused_on_another_host() -> None:
    with pytest.raises(ValidationError) as info:
        HostConfig(gpu={"probe": "nvml"})
    message = str(info.value)
    assert "probe: nvml reads the GPUs of the machine the gateway runs on" in message
    assert "use probe: prometheus" in message
    HostConfig(gpu={"probe": "none"})  # the others are fine
    HostConfig(gpu={"probe": "prometheus", "prometheus": {"url": "http://prom:9090"}})


def test_a_host_needs_a_gpu_section() -> None:
    with pytest.raises(ValidationError) as info:
        HostConfig.model_validate({"docker": {"url": "http://node-c:2375"}})
    assert info.value.errors()[0]["loc"] == ("gpu",)
    assert info.value.errors()[0]["type"] == "missing"


def test_a_gpu_beyond_the_hosts_simulated_count_is_refused() -> None:
    two = {**NODE_C, "gpu": {"probe": "sim", "sim": {"count": 2}}}
    found = problem({"node-c": two}, {"c": docker("node-c", gpus=[0, 2])})
    assert found == (
        "backends.c.gpus: GPU 2 does not exist on host 'node-c' (hosts.node-c.gpu.sim.count is 2)"
    )
    assert problem({"node-c": two}, {"c": docker("node-c", gpus=[1])}) is None
    # The local host's count is not node-c's: GPU 1 on local (count 1) is refused.
    found = problem({"node-c": two}, {"a": docker(gpus=[1])})
    assert found == "backends.a.gpus: GPU 1 does not exist on host 'local' (gpu.sim.count is 1)"


def test_a_kubernetes_backend_with_a_host_is_admitted_and_takes_vram_mib() -> None:
    backend = BackendConfig(**kubernetes(host="node-c", vram_mib=20000, gpus=[0]))
    assert backend.gpus_accounted
    assert backend.vram_mib == 20000
    assert problem({"node-c": NODE_C}, {"k": kubernetes(host="node-c", vram_mib=20000)}) is None
    # Lazy on a host: the footprint is needed for admission, as for docker.
    with pytest.raises(ValidationError) as info:
        BackendConfig(**kubernetes(host="node-c"))
    assert "vram_mib: is required for lifecycle: lazy" in str(info.value)


def test_a_kubernetes_backend_without_a_host_refuses_vram_mib() -> None:
    backend = BackendConfig(**kubernetes())
    assert not backend.gpus_accounted
    with pytest.raises(ValidationError) as info:
        BackendConfig(**kubernetes(vram_mib=20000))
    message = str(info.value)
    assert "vram_mib: a kubernetes backend without host: runs on the cluster's GPUs" in message
    assert "name the node in host:" in message


def test_the_settings_refuse_what_check_hosts_refuses() -> None:
    found = refusal(hosts={"node-c": NODE_C}, backends={"x": docker("node-x")})
    assert "backends.x.host: no host 'node-x' in hosts: (known: local, node-c)" in found


def write_models(tmp_path: Path, data: dict[str, Any]) -> Path:
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


def load_problems(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(write_models(tmp_path, data))
    return info.value.problems


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"hosts": {"node-c": NODE_C}, "backends": {"x": docker("node-x")}},
            "backends.x.host: no host 'node-x' in hosts: (known: local, node-c)",
        ),
        (
            {"hosts": {"local": NODE_C}, "backends": {"a": docker()}},
            "hosts.local: 'local' is the gateway's own machine",
        ),
        (
            {"hosts": {"node c": NODE_C}, "backends": {"a": docker()}},
            "hosts.node c: a host name is 1 to 64 lowercase letters",
        ),
        (
            {"hosts": {"node-c": {"gpu": {"probe": "sim"}}}, "backends": {"c": docker("node-c")}},
            "backends.c.runtime: docker on host 'node-c', which has no docker:",
        ),
        (
            {
                "hosts": {"node-c": NODE_C},
                "backends": {"c": docker("node-c", gpus=[1])},
            },
            "backends.c.gpus: GPU 1 does not exist on host 'node-c'",
        ),
    ],
)
def test_load_settings_names_models_yaml(
    tmp_path: Path, data: dict[str, Any], expected: str
) -> None:
    found = load_problems(tmp_path, data)
    assert len(found) == 1, found
    assert found[0].startswith(f"{tmp_path / 'models.yaml'}: "), found
    assert expected in found[0], found


def test_load_settings_names_the_key_of_a_host_field(tmp_path: Path) -> None:
    found = load_problems(
        tmp_path,
        {"hosts": {"node-c": {"gpu": {"probe": "nvml"}}}, "backends": {"a": docker()}},
    )
    assert found == [
        f"{tmp_path / 'models.yaml'}: hosts.node-c.gpu: probe: nvml reads the GPUs of the "
        "machine the gateway runs on, not this host's: use probe: prometheus (dcgm-exporter "
        "on that host), sim or none"
    ]
    found = load_problems(tmp_path, {"backends": {"k": kubernetes(vram_mib=20000)}})
    assert len(found) == 1
    assert found[0].startswith(f"{tmp_path / 'models.yaml'}: backends.k: vram_mib: ")


def test_load_settings_accepts_a_kubernetes_backend_on_a_host(tmp_path: Path) -> None:
    data = {
        "hosts": {"node-c": {"gpu": {"probe": "sim"}}},
        "backends": {"k": kubernetes(host="node-c", vram_mib=20000)},
    }
    settings = load_settings(write_models(tmp_path, data))
    assert settings.backends["k"].host_name == "node-c"
    assert settings.backends["k"].vram_mib == 20000


@pytest.mark.parametrize(
    ("section", "url"),
    [
        ("docker", "http://admin:secret@node-c:2375"),
        ("prometheus", "http://admin:secret@prometheus:9090"),
    ],
)
def test_a_url_with_credentials_is_refused(section: str, url: str) -> None:
    gpu: dict[str, Any] = {"probe": "sim"}
    host: dict[str, Any] = {"docker": {"url": "http://node-c:2375"}, "gpu": gpu}
    if section == "docker":
        host["docker"] = {"url": url}
    else:
        host["gpu"] = {"probe": "prometheus", "prometheus": {"url": url}}
    with pytest.raises(ValidationError) as refused:
        Settings(hosts={"node-c": host}, backends={"c": docker("node-c")})
    message = str(refused.value)
    assert "must not carry credentials (user:password@)" in message
    assert "secret" not in message.replace(url, "")  # only pydantic's echo of the input


def test_a_backend_or_provider_url_with_credentials_is_refused_too() -> None:
    with pytest.raises(ValidationError) as refused:
        BackendConfig.model_validate({"url": "http://me:pw@127.0.0.1:8000", "models": ["m"]})
    assert "must not carry credentials (user:password@)" in str(refused.value)
    assert "api_key_env" in str(refused.value)
    with pytest.raises(ValidationError) as refused:
        ProviderConfig.model_validate(
            {"kind": "openai", "base_url": "https://me:pw@api.example.com/v1", "models": ["x"]}
        )
    assert "must not carry credentials (user:password@)" in str(refused.value)


def test_a_hosts_docker_needs_its_own_url() -> None:
    implicit = {"docker": {}, "gpu": {"probe": "sim"}}
    found = problem({"node-c": implicit}, {"c": docker("node-c")})
    assert found is not None
    assert found.startswith("hosts.node-c.docker.url: required (the default is this machine's")
    same = {"docker": {"url": "unix:///var/run/docker.sock"}, "gpu": {"probe": "sim"}}
    found = problem({"node-c": same}, {"c": docker("node-c")})
    assert found == (
        "hosts.node-c.docker.url: unix:///var/run/docker.sock is the gateway's own Docker "
        "(the top-level docker.url); give that host's socket proxy"
    )
    # A socket forwarded from node-c (ssh -L /tmp/node-c.sock:/var/run/docker.sock) is fine.
    forwarded = {"docker": {"url": "unix:///tmp/node-c.sock"}, "gpu": {"probe": "sim"}}
    assert problem({"node-c": forwarded}, {"c": docker("node-c")}) is None


def test_the_kubernetes_api_url_may_not_carry_credentials() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(
            kubernetes={"api_url": "https://admin:pw@10.0.0.1:6443"},
            backends={"a": {"url": "http://127.0.0.1:9000", "models": ["a"]}},
        )
    assert "must not carry credentials (user:password@)" in str(refused.value)
    assert "give a token in the kubeconfig" in str(refused.value)

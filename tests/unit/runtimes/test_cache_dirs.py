"""Where a server's caches live, and whether they outlive it (`app.runtimes.cache_dirs`)."""

from __future__ import annotations

import yaml

from app.runtimes.cache_dirs import Mount, cache_dirs, container_warnings, process_warnings
from tests.fakes.processes import ROOT


def paths(env: dict[str, str], home: str = "/root") -> tuple[str, str]:
    vllm, hub = cache_dirs(env, home)
    return vllm.path, hub.path


def test_the_defaults_and_each_variable_as_vllm_and_huggingface_hub_read_them() -> None:
    assert paths({}) == ("/root/.cache/vllm", "/root/.cache/huggingface/hub")
    assert paths({"XDG_CACHE_HOME": "/c"}) == ("/c/vllm", "/c/huggingface/hub")
    assert paths({"VLLM_CACHE_ROOT": "/v", "HF_HOME": "/h"}) == ("/v", "/h/hub")
    assert paths({"HF_HOME": "/h", "HF_HUB_CACHE": "/hub"})[1] == "/hub"
    assert paths({"VLLM_CACHE_ROOT": "~/vc"}, home="/home/me")[0] == "/home/me/vc"


def test_a_container_with_both_caches_on_volumes_is_fine() -> None:
    mounts = [
        Mount("volume", "/root/.cache/huggingface"),
        Mount("bind", "/root/.cache/vllm/"),
    ]
    assert container_warnings({}, mounts) == []
    assert container_warnings({}, [Mount("volume", "/root/.cache")]) == []  # a parent


def test_a_cache_in_the_containers_own_file_system_or_a_tmpfs_is_named() -> None:
    mounts = [Mount("volume", "/root/.cache/huggingface"), Mount("tmpfs", "/root/.cache/vllm")]
    [warning] = container_warnings({}, mounts)
    assert warning.startswith("vLLM's compile cache (/root/.cache/vllm) is inside the container")
    assert "the torch.compile of a cold start is paid again" in warning
    # A sibling whose name starts the same is not the cache's directory.
    near = [Mount("volume", "/root/.cache/vllm-old"), Mount("volume", "/root/.cache/huggingface")]
    assert len(container_warnings({}, near)) == 1


def test_the_containers_environment_moves_the_caches() -> None:
    env = {"VLLM_CACHE_ROOT": "/data/vllm", "HF_HOME": "/data/hf"}
    assert container_warnings(env, [Mount("bind", "/data")]) == []
    assert len(container_warnings(env, [Mount("volume", "/root/.cache")])) == 2


def test_a_process_caches_under_tmp_are_lost_at_reboot() -> None:
    assert process_warnings({"HOME": "/home/me"}) == []
    [warning] = process_warnings({"HOME": "/home/me", "VLLM_CACHE_ROOT": "/tmp/vllm"})
    assert warning.startswith("vLLM's compile cache (/tmp/vllm) is under /tmp, usually a tmpfs")
    assert len(process_warnings({"HOME": "/tmp"})) == 2


def test_every_model_server_of_the_compose_file_keeps_its_caches_on_volumes() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    servers = {n: s for n, s in compose["services"].items() if n.startswith("vllm-")}
    assert len(servers) == 3
    for name, service in servers.items():
        mounts = [Mount("volume", v.split(":")[1]) for v in service["volumes"]]
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        assert container_warnings(env, mounts) == [], name
        assert {v.split(":")[0] for v in service["volumes"]} <= set(compose["volumes"])

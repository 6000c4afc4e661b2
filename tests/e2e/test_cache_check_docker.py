"""`check-config` reads, through the real Docker Engine, where a backend's container keeps
vLLM's compile cache and the Hugging Face cache, and names each that is not on a volume
(`app.cli.cache_check`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import docker_env
from tests.fakes.processes import ROOT, free_port

pytestmark = pytest.mark.e2e

NAME = "microscheduler-test-caches"


def check_config(tmp_path: Path, port: int) -> list[str]:
    config = tmp_path / "config"
    config.mkdir(exist_ok=True)
    (config / "models.yaml").write_text(
        "backends:\n"
        "  cached:\n"
        f"    url: http://127.0.0.1:{port}\n"
        "    models: [fake-model]\n"
        f"    runtime: {{kind: docker, container: {NAME}}}\n"
        "gpu: {probe: sim}\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "check-config", "--config", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("warning: backends.")]


def test_caches_in_the_containers_own_file_system_are_named(
    tmp_path: Path, docker_engine: docker_env.DockerEngine, fake_vllm_image: str
) -> None:
    port = free_port()
    docker_env.create_fake_vllm_container(docker_engine, NAME, port)  # HOME=/tmp, no volume
    try:
        assert check_config(tmp_path, port) == [
            "warning: backends.cached: vLLM's compile cache (/tmp/.cache/vllm) is inside the "
            "container, not on a volume: it is lost when the container is re-created, and "
            "then the torch.compile of a cold start is paid again (mount a volume on "
            "/tmp/.cache/vllm)",
            "warning: backends.cached: the Hugging Face cache (/tmp/.cache/huggingface/hub) is "
            "inside the container, not on a volume: it is lost when the container is "
            "re-created, and then the model's download is paid again (mount a volume on "
            "/tmp/.cache/huggingface/hub)",
        ]
    finally:
        docker_env.remove_container(docker_engine, NAME)


def test_a_volume_on_the_cache_directory_satisfies_the_check(
    tmp_path: Path, docker_engine: docker_env.DockerEngine, fake_vllm_image: str
) -> None:
    port = free_port()
    cache = tmp_path / "cache"
    cache.mkdir()
    mounts = [{"Type": "bind", "Source": str(cache), "Target": "/tmp/.cache"}]
    docker_env.create_fake_vllm_container(docker_engine, NAME, port, mounts=mounts)
    try:
        assert check_config(tmp_path, port) == []
    finally:
        docker_env.remove_container(docker_engine, NAME)


def test_a_container_not_created_yet_is_not_checked(tmp_path: Path) -> None:
    assert check_config(tmp_path, free_port()) == []

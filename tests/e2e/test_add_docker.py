"""docs/first-model.md against the real Docker Engine: its `microscheduler add` command,
run as the page prints it, writes a configuration `check-config` accepts and prints a
`docker create` line that the engine accepts (with the image replaced by the local
fake-vLLM tag: no registry here), creating the container the gateway's Docker runtime
then finds by name. `--gpus` is kept: the engine accepts it at create without the NVIDIA
runtime (only a start needs it)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.add.launch import DEFAULT_IMAGE
from app.runtimes.docker import DockerRuntime
from app.runtimes.docker_api import DockerApi
from app.settings import DockerRuntimeConfig, load_settings
from tests.docs import page, section
from tests.fakes import docker_env
from tests.fakes.processes import ROOT

pytestmark = pytest.mark.e2e

CONTAINER = "vllm-qwen3-8b"  # the page's backend, qwen3-8b


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)


def microscheduler(
    command: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A `microscheduler ...` line of the page, run as the installed command runs it."""
    argv = shlex.split(command.split("#", 1)[0])
    assert argv[0] == "microscheduler", command
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def docker_cli() -> str:
    path = shutil.which("docker")
    if path is None:
        docker_env.require_system(
            "the docker command is not installed", hint="Debian: apt-get install docker.io"
        )
        raise AssertionError("unreachable")  # pragma: no cover
    return path


async def test_the_pages_docker_create_line_is_accepted_and_found_by_the_gateway(
    tmp_path: Path, docker_engine: docker_env.DockerEngine, fake_vllm_image: str
) -> None:
    docker = docker_cli()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT")
    }
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    text = page("first-model")
    [add_command] = sh_blocks(section(text, "2. Add the model"))
    added = microscheduler(add_command.strip(), tmp_path, env)
    assert added.returncode == 0, added.stderr
    [check_command] = sh_blocks(section(text, "4. Check the configuration"))
    checked = microscheduler(check_command.strip(), tmp_path, env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[:2] == [
        "my-config: configuration is valid (1 backend, 1 model name)",
        "  qwen3-8b: http://127.0.0.1:8001 [docker] serves qwen3-8b",
    ]

    create = added.stdout.split("\n\n")
    [line] = [block for block in create if block.startswith("docker create")]
    assert DEFAULT_IMAGE in line
    # The local image, and the test label (the session removes what carries it).
    line = line.replace(DEFAULT_IMAGE, fake_vllm_image)
    line = line.replace(" \\\n", f" --label {docker_env.TEST_LABEL}=1 \\\n", 1)
    with docker_engine.client() as client:
        found = client.get(f"/containers/{CONTAINER}/json")
    if found.status_code == 200:
        labels = found.json()["Config"]["Labels"] or {}
        if labels.get(docker_env.TEST_LABEL) != "1":
            pytest.fail(f"a container {CONTAINER} this test did not make exists; not touching it")
        docker_env.remove_container(docker_engine, CONTAINER)
    try:
        made = subprocess.run(
            ["bash", "-c", line.replace("docker create", shlex.quote(docker) + " create", 1)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        # The page's two volumes are the caches' directories: check-config, now able to
        # inspect the container, finds nothing to say of them.
        rechecked = microscheduler(check_command.strip(), tmp_path, env)
        assert rechecked.returncode == 0, rechecked.stderr
        assert "cache" not in rechecked.stdout
        info = docker_env.inspect_container(docker_engine, CONTAINER)
        config, host = info["Config"], info["HostConfig"]
        assert config["Image"] == fake_vllm_image
        assert config["Labels"] == {
            "microscheduler.backend": "qwen3-8b",
            docker_env.TEST_LABEL: "1",
        }
        assert "VLLM_SERVER_DEV_MODE=1" in config["Env"]
        command = config["Cmd"]
        assert command[:2] == ["--model", "Qwen/Qwen3-8B"]
        for flag in ("--enable-sleep-mode", "--enable-auto-tool-choice"):
            assert flag in command
        assert command[command.index("--tool-call-parser") + 1] == "hermes"
        assert command[command.index("--port") + 1] == "8001"
        backend = load_settings(tmp_path / "my-config").backends["qwen3-8b"]
        assert backend.model_info is not None
        assert command[command.index("--max-model-len") + 1] == str(
            backend.model_info.max_model_len
        )
        assert host["PortBindings"] == {"8001/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]}
        assert sorted(host["Binds"]) == [
            f"{home}/.cache/huggingface:/root/.cache/huggingface",
            f"{home}/.cache/vllm:/root/.cache/vllm",
        ]
        [gpus] = host["DeviceRequests"]
        assert (gpus["DeviceIDs"], gpus["Capabilities"]) == (["0"], [["gpu"]])
        assert host["IpcMode"] == "host"

        settings = load_settings(tmp_path / "my-config")
        runtime = settings.backends["qwen3-8b"].runtime
        assert isinstance(runtime, DockerRuntimeConfig)
        api = DockerApi(settings.docker)
        try:
            status = await DockerRuntime("qwen3-8b", runtime, api).status()
        finally:
            await api.aclose()
        assert (status.running, status.detail) == (False, "created (never started)")
    finally:
        docker_env.remove_container(docker_engine, CONTAINER)


async def test_the_placements_docker_create_lines_give_each_container_its_gpus(
    tmp_path: Path, docker_engine: docker_env.DockerEngine, fake_vllm_image: str
) -> None:
    """docs/first-model.md, One container per placement, tensor parallel: the lines `add
    --placements 0,1 2,3` prints, run by Docker's CLI, create two containers with GPUs
    0 and 1, and 2 and 3 (the quoted device list), both publishing the backend's port; the
    gateway's runtime reads them as the backend's placements."""
    docker = docker_cli()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    text = section(page("first-model"), "One container per placement")
    assert "`--placements 0,1 2,3`" in text
    assert "`--gpus '\"device=0,1\"'`" in text
    [command] = sh_blocks(text)
    command = command.strip().replace("--placements 0 1", "--placements 0,1 2,3")
    added = microscheduler(command, tmp_path, env)
    assert added.returncode == 0, added.stderr
    lines = [block for block in added.stdout.split("\n\n") if block.startswith("docker create")]
    names = ["vllm-qwen3-8b-gpu0-1", "vllm-qwen3-8b-gpu2-3"]
    assert [shlex.split(line.replace("\\\n", ""))[3] for line in lines] == names
    for name in names:
        with docker_engine.client() as client:
            found = client.get(f"/containers/{name}/json")
        if found.status_code == 200:
            labels = found.json()["Config"]["Labels"] or {}
            if labels.get(docker_env.TEST_LABEL) != "1":
                pytest.fail(f"a container {name} this test did not make exists; not touching it")
            docker_env.remove_container(docker_engine, name)
    try:
        for line in lines:
            line = line.replace(DEFAULT_IMAGE, fake_vllm_image)
            line = line.replace(" \\\n", f" --label {docker_env.TEST_LABEL}=1 \\\n", 1)
            made = subprocess.run(
                ["bash", "-c", line.replace("docker create", shlex.quote(docker) + " create", 1)],
                env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert made.returncode == 0, made.stderr
        hosts = [docker_env.inspect_container(docker_engine, n)["HostConfig"] for n in names]
        assert [host["DeviceRequests"][0]["DeviceIDs"] for host in hosts] == [
            ["0", "1"],
            ["2", "3"],
        ]
        assert [host["DeviceRequests"][0]["Count"] for host in hosts] == [0, 0]
        binding = {"8001/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]}
        assert [host["PortBindings"] for host in hosts] == [binding, binding]

        settings = load_settings(tmp_path / "my-gpus")
        runtime = settings.backends["qwen3-8b"].runtime
        assert isinstance(runtime, DockerRuntimeConfig)
        api = DockerApi(settings.docker)
        try:
            status = await DockerRuntime("qwen3-8b", runtime, api).status()
        finally:
            await api.aclose()
        assert (status.running, status.detail, status.gpus) == (
            False,
            "vllm-qwen3-8b-gpu0-1: created (never started)",
            (0, 1),
        )
    finally:
        for name in names:
            docker_env.remove_container(docker_engine, name)

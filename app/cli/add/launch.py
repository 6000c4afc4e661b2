"""The command that creates the server: `docker create ...` for the Docker runtime (the
gateway then starts and stops the container by name), or `vllm serve ...` for a process
(which the gateway runs itself: printed to try it by hand). Pure: each is a list of
argument groups, one per printed line.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.cli.add.backend import Request
from app.cli.add.source import CONTAINER_HF_HOME

DEFAULT_IMAGE = "vllm/vllm-openai:latest"  # what docker-compose.yml runs
CONTAINER_VLLM_CACHE = "/root/.cache/vllm"  # VLLM_CACHE_ROOT of root (vllm/envs.py:714)
CONTAINER_MODELS = "/models"  # where a local model directory is mounted
#: Says which backend a container is: `docker ps --filter label=microscheduler.backend`.
#: The gateway itself finds the container by name (runtime.container), as compose's are.
BACKEND_LABEL = "microscheduler.backend"


@dataclass(frozen=True)
class Mounts:
    """Host directories the container sees: the Hugging Face cache (weights downloaded
    once), vLLM's cache (its torch.compile cache: a restart does not compile again), and a
    local model directory."""

    hf_home: Path  # mounted on /root/.cache/huggingface
    hub_cache: Path | None  # $HF_HUB_CACHE outside $HF_HOME/hub: mounted on .../hub
    vllm_cache: Path
    local_model: Path | None = None


def container_model_path(name: str) -> str:
    return f"{CONTAINER_MODELS}/{name}"


def docker_create(
    request: Request,
    serve_args: Sequence[str],
    env: dict[str, str],
    mounts: Mounts,
    *,
    image: str = DEFAULT_IMAGE,
) -> list[list[str]]:
    """`docker create` for the backend: its name and label, the GPU, the port on
    127.0.0.1 only (vLLM's sleep routes have no authentication), the caches, the
    environment, the image and vLLM's arguments (the image's entrypoint is `vllm serve`;
    `--model` as docker-compose.yml passes it). One per placement: `docker_creates`."""
    return docker_creates(request, serve_args, env, mounts, image=image)[0]


def docker_creates(
    request: Request,
    serve_args: Sequence[str],
    env: dict[str, str],
    mounts: Mounts,
    *,
    image: str = DEFAULT_IMAGE,
) -> list[list[list[str]]]:
    """`docker create` of each container (one per placement), alike but for the name
    and the GPUs; every one publishes the backend's one port (one runs at a time)."""
    return [
        _create(request, name, gpus, serve_args, env, mounts, image)
        for gpus, name in request.containers
    ]


def gpus_flag(gpus: Sequence[int]) -> str:
    """`--gpus`'s value for these GPUs. Docker's CLI reads the value as CSV, so a list of
    devices is quoted inside it, as Docker's and NVIDIA's docs write it: `--gpus
    '"device=0,1"'`. Unquoted, `device=0,1` is cut at the comma into `device=0` and a
    count of 1: the container gets GPU 0 alone (Docker 28.2 CLI: DeviceIDs ["0"], Count 1)."""
    devices = ",".join(map(str, gpus))
    return f"device={devices}" if len(gpus) == 1 else f'"device={devices}"'


def _create(
    request: Request,
    name: str,
    gpus: Sequence[int],
    serve_args: Sequence[str],
    env: dict[str, str],
    mounts: Mounts,
    image: str,
) -> list[list[str]]:
    lines = [
        ["docker", "create", "--name", name],
        ["--label", f"{BACKEND_LABEL}={request.name}"],
        ["--gpus", gpus_flag(gpus), "--ipc=host"],
        ["-p", f"127.0.0.1:{request.port}:{request.port}"],
        ["-v", f"{mounts.hf_home}:{CONTAINER_HF_HOME}"],
    ]
    if mounts.hub_cache is not None:
        lines.append(["-v", f"{mounts.hub_cache}:{CONTAINER_HF_HOME}/hub"])
    lines.append(["-v", f"{mounts.vllm_cache}:{CONTAINER_VLLM_CACHE}"])
    if mounts.local_model is not None:
        target = container_model_path(request.name)
        lines.append(["-v", f"{mounts.local_model}:{target}:ro"])
    lines += [["-e", f"{key}={value}"] for key, value in env.items()]
    lines.append(["-e", "HF_TOKEN"])  # passed on when set (gated models)
    model, *rest = serve_args
    lines.append([image, "--model", model])
    lines += _flag_lines(rest)
    return lines


def vllm_serve(request: Request, serve_args: Sequence[str], env: dict[str, str]) -> list[list[str]]:
    """The process backend's command, with its environment first."""
    head = [f"{key}={value}" for key, value in env.items()]
    model, *rest = serve_args
    return [[*head, request.vllm, "serve", model], *_flag_lines(rest)]


def _flag_lines(args: Sequence[str]) -> list[list[str]]:
    """`--flag value` pairs (and lone `--flag`s) on lines of their own."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return lines


def shell_text(lines: Sequence[Sequence[str]]) -> str:
    """The groups as one shell command over several lines (` \\` continuations)."""
    return " \\\n  ".join(shlex.join(line) for line in lines)


def argv(lines: Sequence[Sequence[str]]) -> list[str]:
    return [arg for line in lines for arg in line]

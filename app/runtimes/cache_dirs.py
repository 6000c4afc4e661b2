"""Where a vLLM server keeps what makes its next start fast, and whether it outlives the
server: pure, for `check-config`.

Two caches matter. vLLM's own (`VLLM_CACHE_ROOT`: `torch_compile_cache`, with Inductor's
and Triton's caches inside it) saves the torch.compile of a cold start, minutes on a big
model; the Hugging Face cache saves the download. Where each lives, as the server
derives it:

- vLLM: `$VLLM_CACHE_ROOT`, else `$XDG_CACHE_HOME/vllm`, else `~/.cache/vllm`
  (vllm/envs.py:714 and `get_default_cache_root`, :340); the compile cache under it
  (vllm/compilation/backends.py:1096), Triton's too unless `TRITON_CACHE_DIR` moves it
  (vllm/compilation/compiler_interface.py:35).
- Hugging Face: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`,
  else `~/.cache/huggingface/hub` (huggingface_hub's constants; `app.cli.add.source`).

A container's caches outlive it only on a volume or a bind mount: its own file system
survives a stop and start (what the gateway does) but not `docker rm` or a re-create
(`docker compose up` after an image pull or a change of its service). A process's
caches are lost at reboot when they sit on a tmpfs such as /tmp.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

# Directories that are a tmpfs on common Linux systems (systemd mounts /tmp on a tmpfs on
# many distributions; /dev/shm and /run always are).
_VOLATILE: Final = ("/tmp", "/dev/shm", "/run", "/var/run")
CONTAINER_HOME: Final = "/root"  # vllm/vllm-openai runs as root


@dataclass(frozen=True, slots=True)
class CacheDir:
    what: str  # in a warning: "vLLM's compile cache"
    path: str
    saves: str  # what a persistent one saves


@dataclass(frozen=True, slots=True)
class Mount:
    """One of a container's `Mounts` (`GET /containers/{id}/json`): `Type` is `bind`,
    `volume`, `tmpfs`, `image`, `npipe` or `cluster` (Docker Engine API, MountPoint)."""

    type: str
    destination: str


def cache_dirs(env: Mapping[str, str], home: str) -> tuple[CacheDir, CacheDir]:
    """vLLM's cache and the Hugging Face hub cache for a server with `env` and `home`."""
    cache_root = env.get("XDG_CACHE_HOME") or posixpath.join(home, ".cache")
    vllm = env.get("VLLM_CACHE_ROOT") or posixpath.join(cache_root, "vllm")
    if env.get("HF_HUB_CACHE"):
        hub = env["HF_HUB_CACHE"]
    else:
        hub = posixpath.join(env.get("HF_HOME") or posixpath.join(cache_root, "huggingface"), "hub")
    return (
        CacheDir("vLLM's compile cache", _norm(vllm, home), "the torch.compile of a cold start"),
        CacheDir("the Hugging Face cache", _norm(hub, home), "the model's download"),
    )


def container_warnings(env: Mapping[str, str], mounts: Iterable[Mount]) -> list[str]:
    """What of a container's caches lives in its own file system (or a tmpfs)."""
    kept = [m for m in mounts if m.type in ("bind", "volume")]
    found = []
    for cache in cache_dirs(env, env.get("HOME") or CONTAINER_HOME):
        if not any(_within(cache.path, m.destination) for m in kept):
            found.append(
                f"{cache.what} ({cache.path}) is inside the container, not on a volume: it is "
                f"lost when the container is re-created, and then {cache.saves} is paid "
                f"again (mount a volume on {cache.path})"
            )
    return found


def process_warnings(env: Mapping[str, str]) -> list[str]:
    """What of a process's caches sits on a directory that is a tmpfs on most systems."""
    found = []
    for cache in cache_dirs(env, env.get("HOME") or "~"):
        volatile = next((v for v in _VOLATILE if _within(cache.path, v)), None)
        if volatile is not None:
            found.append(
                f"{cache.what} ({cache.path}) is under {volatile}, usually a tmpfs: it is "
                f"lost at reboot, and then {cache.saves} is paid again"
            )
    return found


def _norm(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    return posixpath.normpath(path)


def _within(path: str, directory: str) -> bool:
    directory = posixpath.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")

"""Which GPUs a backend uses (`gpus:`), how many (`tensor_parallel_size:`), and, for a
Docker backend, which container runs on which (`runtime.placements:`). Pure: no I/O.

- `gpus: [0, 1]`: those GPUs, always (the default is `[0]`).
- `gpus: auto`, or a count (`gpus: 2`): the gateway chooses that many GPUs at each start,
  among those of its host with room (`app.vram.choose`, by the host's `gpu.placement:`
  policy, `pack` or `spread`). `auto` is as many as its tensor-parallel size (1 without).
- `tensor_parallel_size: N`, or vLLM's own flag in a process command
  (`--tensor-parallel-size N`, `-tp N`: vllm/engine/arg_utils.py), is how many GPUs one
  instance spreads over: it must match the GPUs listed or counted.
- A Docker container's GPUs are fixed when it is created (`--gpus device=N`), so a Docker
  backend chosen at each start lists one created container per placement; the gateway
  starts the one whose GPUs have room.
- A process child is told its GPUs by `CUDA_VISIBLE_DEVICES` (`child_gpus_env`), as CUDA
  reads it; a command's own `CUDA_VISIBLE_DEVICES` must agree with a fixed `gpus:`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Literal

from pydantic import NonNegativeInt, PositiveInt

from app.settings.runtimes import (
    DockerPlacement,
    DockerRuntimeConfig,
    ProcessRuntimeConfig,
    RuntimeConfig,
)

# What CUDA reads to choose the devices a process sees (and numbers from 0).
CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
# CUDA numbers devices fastest first by default, NVML (the gateway's probe, nvidia-smi) by
# PCI bus: with PCI_BUS_ID the indexes agree. vLLM warns to set it on a box with mixed
# GPUs (vllm/platforms/cuda.py: log_warnings).
CUDA_DEVICE_ORDER: Final = "CUDA_DEVICE_ORDER"
# vLLM's spellings of its tensor-parallel flag (vllm/engine/arg_utils.py: add_argument
# "--tensor-parallel-size", "-tp"); argparse also takes `--flag=N`.
TP_FLAGS: Final = ("--tensor-parallel-size", "-tp")

GpusSpec = list[NonNegativeInt] | Literal["auto"] | PositiveInt


def tp_in_command(command: Sequence[str]) -> int | None:
    """The tensor-parallel size a vLLM command line asks for (None: not given)."""
    for i, word in enumerate(command):
        for flag in TP_FLAGS:
            if word == flag and i + 1 < len(command):
                return _int(command[i + 1], flag)
            if word.startswith(f"{flag}="):
                return _int(word.split("=", 1)[1], flag)
    return None


def _int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"runtime.command: {flag} {text!r} is not a number") from None
    if value < 1:
        raise ValueError(f"runtime.command: {flag} {value} must be at least 1")
    return value


def command_tp(runtime: RuntimeConfig) -> int | None:
    """The tensor-parallel size a process runtime's command asks for (None: not given)."""
    return tp_in_command(runtime.command) if isinstance(runtime, ProcessRuntimeConfig) else None


def check_runtime_gpus(gpus: GpusSpec, tensor_parallel: int | None, runtime: RuntimeConfig) -> None:
    """`check_gpus` for a backend run by `runtime`."""
    check_gpus(
        gpus,
        tensor_parallel,
        command_tp(runtime),
        runtime.placements if isinstance(runtime, DockerRuntimeConfig) else None,
        runtime.kind,
        runtime.env if isinstance(runtime, ProcessRuntimeConfig) else {},
    )


def first_placed(runtime: RuntimeConfig) -> tuple[int, ...] | None:
    """The GPUs of a Docker runtime's first placement (None: no placements). A backend
    with placements runs nowhere else: this is where it starts when nothing chooses (no
    GPU reading) and where a GPU profile plans it, not GPUs 0..N-1."""
    if isinstance(runtime, DockerRuntimeConfig) and runtime.placements:
        return tuple(sorted(runtime.placements[0].gpus))
    return None


def gpu_count(gpus: GpusSpec, tensor_parallel: int | None) -> int:
    """How many GPUs one instance uses."""
    if isinstance(gpus, list):
        return len(gpus)
    if gpus == "auto":
        return tensor_parallel or 1
    return gpus


def check_gpus(
    gpus: GpusSpec,
    tensor_parallel: int | None,
    command_tp: int | None,
    placements: Sequence[DockerPlacement] | None,
    runtime: str,
    env: Mapping[str, str],
) -> None:
    """Raise ValueError (the config's words) for a `gpus:` that cannot be run as given."""
    if isinstance(gpus, list):
        if not gpus:
            raise ValueError("gpus: lists no GPU (give at least one, a count, or auto)")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"gpus: lists a GPU twice: {gpus}")
    if tensor_parallel is not None and command_tp is not None and tensor_parallel != command_tp:
        raise ValueError(
            f"tensor_parallel_size: {tensor_parallel}, but the command says "
            f"--tensor-parallel-size {command_tp}"
        )
    tp = tensor_parallel or command_tp
    count = gpu_count(gpus, tp)
    if tp is not None and tp != count:
        raise ValueError(
            f"tensor_parallel_size {tp} needs {tp} GPUs at once, but gpus: gives {count} "
            f"({gpus}); make them agree"
        )
    chosen = not isinstance(gpus, list)
    if runtime == "docker":
        _check_placements(gpus, count, placements)
    elif placements:
        raise ValueError("runtime.placements: only a docker runtime has containers to choose from")
    elif chosen and runtime == "kubernetes":
        raise ValueError(
            f"gpus: {gpus}: a kubernetes pod's GPUs are chosen by the cluster's device "
            "plugin, not by the gateway (list the GPUs of its host, or remove host:)"
        )
    visible = env.get(CUDA_VISIBLE_DEVICES)
    if visible is not None and runtime == "process":
        if chosen:
            raise ValueError(
                f"runtime.env.{CUDA_VISIBLE_DEVICES}: {visible!r} with gpus: {gpus}: the "
                "gateway sets it to the GPUs it chooses at each start; remove it"
            )
        if isinstance(gpus, list) and visible.replace(" ", "") != ",".join(map(str, gpus)):
            raise ValueError(
                f"runtime.env.{CUDA_VISIBLE_DEVICES}: {visible!r} is not gpus: {gpus}: the "
                "gateway would count memory on other GPUs than the server uses; remove it "
                "(the gateway sets it from gpus:)"
            )


def _check_placements(
    gpus: GpusSpec, count: int, placements: Sequence[DockerPlacement] | None
) -> None:
    if not placements:
        if not isinstance(gpus, list):
            raise ValueError(
                f"gpus: {gpus} with runtime docker: a container's GPUs are fixed when "
                "it is created, so list one created container per placement in "
                "runtime.placements (e.g. [{gpus: [0], container: qwen-gpu0}, {gpus: [1], "
                "container: qwen-gpu1}]), or give the container's GPUs as a list"
            )
        return
    if isinstance(gpus, list):
        raise ValueError(
            f"gpus: {gpus} with runtime.placements: the gateway chooses among the placements; "
            "use gpus: auto (or remove gpus:)"
        )
    sets: set[tuple[int, ...]] = set()
    names: set[str] = set()
    for i, placement in enumerate(placements):
        where = f"runtime.placements[{i}]"
        if len(set(placement.gpus)) != len(placement.gpus):
            raise ValueError(f"{where}.gpus: lists a GPU twice: {placement.gpus}")
        if len(placement.gpus) != count:
            raise ValueError(
                f"{where}.gpus: {placement.gpus} is {len(placement.gpus)} GPU(s); the backend "
                f"uses {count} (its tensor-parallel size)"
            )
        key = tuple(sorted(placement.gpus))
        if key in sets:
            raise ValueError(f"{where}.gpus: {placement.gpus} has a container already")
        if placement.container in names:
            raise ValueError(f"{where}.container: {placement.container!r} is listed twice")
        sets.add(key)
        names.add(placement.container)


def child_gpus_env(gpus: Sequence[int], env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a child process that must see exactly `gpus` (the probe's indexes; CUDA
    numbers them from 0 in this order), with CUDA counting devices as the probe does unless
    `env` says otherwise."""
    return {
        **env,
        CUDA_DEVICE_ORDER: env.get(CUDA_DEVICE_ORDER, "PCI_BUS_ID"),
        CUDA_VISIBLE_DEVICES: ",".join(map(str, gpus)),
    }

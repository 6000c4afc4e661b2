"""The GPUs a fake vLLM server holds memory on, as a CUDA process sees them: `--gpu`, or
the first `--tensor-parallel-size` of `CUDA_VISIBLE_DEVICES` (which the gateway sets for
the GPUs it placed the server on)."""

from __future__ import annotations

import argparse


def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU index list: {text!r}") from None
    if any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"GPU indexes must be >= 0: {text!r}")
    return gpus


VISIBLE = "CUDA_VISIBLE_DEVICES"


def placed_gpus(
    p: argparse.ArgumentParser, gpus: list[int] | None, tp: int, visible_env: str | None
) -> list[int]:
    """The (physical) GPUs the fake holds memory on: `--gpu`, else the first `tp` of
    `CUDA_VISIBLE_DEVICES` (as a CUDA process sees them), else 0.. `tp`-1. A tensor-parallel
    size beyond the visible GPUs fails as vLLM's does (vllm/config/parallel.py)."""
    if tp < 1:
        p.error("--tensor-parallel-size must be at least 1")
    visible = None
    if visible_env is not None:
        try:
            visible = [int(part) for part in visible_env.split(",") if part.strip()]
        except ValueError:
            p.exit(1, f"RuntimeError: {VISIBLE}={visible_env!r}: not GPU indexes\n")
    if visible is not None and tp > len(visible):
        p.exit(1, f"ValueError: World size ({tp}) is larger than the number of available "
                  f"GPUs ({len(visible)}) in this node.\n")  # fmt: skip
    if gpus:
        if visible is not None and not set(gpus) <= set(visible):
            p.exit(1, f"RuntimeError: --gpu {gpus} is not visible ({VISIBLE}={visible_env})\n")
        return list(dict.fromkeys(gpus))
    return visible[:tp] if visible is not None else list(range(tp))

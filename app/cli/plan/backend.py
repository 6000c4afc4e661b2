"""`plan backend NAME`: one configured backend's footprint on each of its GPUs (weights /
tensor-parallel size + KV cache + CUDA graphs + overhead + CUDA context), where it goes
(its `gpus:` list, or at each start by its host's `gpu.placement:`), and whether vLLM
accepts its tensor-parallel size for the model. `--tensor-parallel-size N` (or `--gpus
N`) plans it on N GPUs instead, to compare.
"""

from __future__ import annotations

import argparse

from app.cli.common import JsonDict, UsageError, emit_plan, load_config
from app.cli.plan.render import gib3, key_values
from app.planner.description import PlannedModel, resolve
from app.planner.footprint import Footprint, instance_spec, spec_footprint
from app.planner.parallel import refusal
from app.planner.units import MIB, bytes_to_gib, gib_to_bytes
from app.settings import BackendConfig, Settings
from app.settings.base import LOCAL_HOST
from app.settings.hosts import GpuConfig


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the backend, as named in models.yaml")
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        "--gpus",
        dest="tensor_parallel_size",
        type=int,
        help="plan it on this many GPUs (default: its own, from gpus: / tensor_parallel_size:)",
    )
    parser.add_argument(
        "--gpu-gib",
        type=float,
        help="memory of each GPU in GiB (default: its host's simulated GPU; none: the sum "
        "of the parts, no --gpu-memory-utilization)",
    )


def _host_gpu(settings: Settings, config: BackendConfig) -> GpuConfig:
    host = config.host_name
    return settings.gpu if host == LOCAL_HOST else settings.hosts[host].gpu


def _gpu_total(args: argparse.Namespace, gpu: GpuConfig) -> tuple[int | None, str]:
    """MiB of each GPU to plan on, and where that is from."""
    if args.gpu_gib is not None:
        if args.gpu_gib <= 0:
            raise UsageError(f"--gpu-gib must be a positive number, got {args.gpu_gib!r}")
        return gib_to_bytes(args.gpu_gib) // MIB, "--gpu-gib"
    if gpu.probe == "sim":
        return gpu.sim.total_mib, "gpu.sim.total_mib"
    return None, "not known: give --gpu-gib"


def placement_text(config: BackendConfig, tp: int, per_gpu_mib: int, policy: str) -> str:
    """Where it goes: always its list, or at each start by its host's policy."""
    host = config.host_name
    if not config.gpus_accounted:
        return "the cluster's scheduler places its pods (kubernetes, no host:)"
    if config.fixed_gpus is not None:
        gpus = ", ".join(map(str, config.fixed_gpus))
        return f"gpus: {list(config.fixed_gpus)}: always on GPU {gpus} of host {host}"
    return (
        f"gpus: {config.gpus}: placed at each start on {gpus_count(tp)} of host {host} with "
        f"{per_gpu_mib:,} MiB free on each (or room made by the usual eviction), by its "
        f"gpu.placement: {policy}"
    )


def gpus_count(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def chosen_note(settings: Settings, name: str) -> str | None:
    """For `plan profile`: a backend placed at each start is planned on its first GPUs;
    say so (None: a `gpus:` list, or a backend the cluster places)."""
    config = settings.backends[name]
    if config.fixed_gpus is not None or not config.gpus_accounted:
        return None
    first = ", ".join(map(str, config.first_gpus))
    policy = _host_gpu(settings, config).placement
    return (
        f"gpus: {config.gpus}: placed at each start on {gpus_count(config.gpu_count)} of host "
        f"{config.host_name} by its gpu.placement: {policy}; planned here on GPU {first}"
    )


def _rows(planned: PlannedModel, tp: int, footprint: Footprint) -> list[tuple[str, str]]:
    parts = footprint.parts
    assert parts is not None  # a planner footprint
    shards = min(tp, planned.model.shape.kv_shard_limit)
    rows = [
        (
            "weights",
            f"{bytes_to_gib(parts.weights_bytes):.2f} GiB ({planned.weights_source}, "
            f"x 1.02 / {tp})",
        ),
        (
            "KV cache",
            f"{bytes_to_gib(parts.kv_cache_bytes):.2f} GiB (at least "
            f"{bytes_to_gib(parts.kv_budget_bytes):.2f}: one request of "
            f"{planned.max_model_len:,} tokens, {planned.kv_dtype.name}, split over {shards})",
        ),
        ("CUDA graphs", f"{bytes_to_gib(parts.cuda_graphs_bytes):.2f} GiB"),
        ("overhead", f"{bytes_to_gib(parts.overhead_bytes):.2f} GiB"),
        ("CUDA context", f"{bytes_to_gib(parts.cuda_context_bytes):.2f} GiB"),
        ("per GPU", f"{footprint.mib:,} MiB ({bytes_to_gib(footprint.mib * MIB):.2f} GiB)"),
    ]
    return rows


def run_backend(args: argparse.Namespace) -> int:
    """``plan backend NAME``: its per-GPU footprint, its placement, its TP check."""
    settings = load_config(args.config)
    config = settings.backends.get(args.name)
    if config is None:
        known = ", ".join(settings.backends)
        raise UsageError(f"unknown backend {args.name!r} (backends: {known})")
    planned = resolve(config.model_info, config.hf_config)
    if planned is None:
        raise UsageError(
            f"backend {args.name!r} has no model description (model_info: or hf_config:) to "
            "plan from"
        )
    tp: int = args.tensor_parallel_size or config.gpu_count
    if tp < 1:
        raise UsageError(f"--tensor-parallel-size must be at least 1, got {tp}")
    gpu = _host_gpu(settings, config)
    total_mib, total_from = _gpu_total(args, gpu)
    head = f"backend {args.name}: {planned.source}, tensor parallel {tp}"
    if tp != config.gpu_count:
        head += f" (configured: {config.gpu_count})"
    data: JsonDict = {
        "backend": args.name,
        "description": planned.source,
        "tensor_parallel_size": tp,
        "configured_tensor_parallel_size": config.gpu_count,
        "placement": config.gpus,
        "host": config.host_name if config.gpus_accounted else None,
        "policy": gpu.placement,
        "gpu_total_mib": total_mib,
        "attention_heads": planned.model.attention_heads,
        "kv_heads": planned.model.shape.kv_heads,
    }
    refused = refusal(planned.model, tp, planned.source)
    if refused is not None:
        data.update(fits=False, refused=refused)
        return emit_plan(args, data, f"{head}\nrefused: {refused}", fits=False)
    spec = instance_spec(planned, gpus=tp, name=args.name)
    footprint = spec_footprint(spec, total_mib)
    parts = footprint.parts
    assert parts is not None
    fits = parts.fits_gpu is not False
    data.update(
        fits=fits,
        refused=None,
        per_gpu_mib=footprint.mib,
        weights_gib_per_gpu=gib3(parts.weights_bytes),
        kv_cache_gib_per_gpu=gib3(parts.kv_cache_bytes),
        kv_budget_gib_per_gpu=gib3(parts.kv_budget_bytes),
        cuda_graphs_gib=gib3(parts.cuda_graphs_bytes),
        overhead_gib=gib3(parts.overhead_bytes),
        cuda_context_gib=gib3(parts.cuda_context_bytes),
        gpu_memory_utilization=parts.gpu_memory_utilization,
        problems=list(parts.problems),
        placed=placement_text(config, config.gpu_count, footprint.mib, gpu.placement),
        admission_mib=config.vram_mib if config.vram_mib is not None else footprint.mib,
    )
    total = "" if total_mib is None else f" of {total_mib:,} MiB"
    lines = [head, f"on each of its {gpus_count(tp)}{total} ({total_from}):"]
    lines += [f"  {line}" for line in key_values(_rows(planned, tp, footprint)).splitlines()]
    flags = [f"--tensor-parallel-size {tp}"] if tp > 1 else []
    if parts.gpu_memory_utilization is not None:
        flags.append(f"--gpu-memory-utilization {parts.gpu_memory_utilization:g}")
    flags.append(f"--max-model-len {planned.max_model_len}")
    lines.append(f"vllm flags: {' '.join(flags)}")
    lines.append(f"placement: {data['placed']}")
    if tp != config.gpu_count:
        lines.append(
            f"note: on {gpus_count(tp)} it needs tensor_parallel_size: {tp} with gpus: auto "
            f"(or a list of {tp} GPUs)"
        )
    if config.vram_mib is not None:
        lines.append(f"note: admission counts its vram_mib {config.vram_mib:,} MiB on each GPU")
    lines += [f"problem: {text}" for text in parts.problems]
    return emit_plan(args, data, "\n".join(lines), fits=fits)

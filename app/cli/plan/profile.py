"""`plan profile`: a GPU profile of the configuration, its instances' vLLM flags, and
whether they fit.
"""

from __future__ import annotations

import argparse
import shlex

from app.cli.common import JsonDict, UsageError, emit_plan, load_config
from app.cli.plan.backend import chosen_note
from app.cli.plan.render import gib3, table
from app.cli.plan.share import instance_json
from app.planner.footprint import ceil_mib
from app.planner.profile_plan import (
    PlannedInstance,
    ProfilePlan,
    plan_all_backends,
    plan_profile,
)
from app.planner.units import bytes_to_gib, gib_to_bytes
from app.settings import PROFILES_FILE, Settings


def _profile_gpu_bytes(args: argparse.Namespace, plan_name: str, gb: float | None) -> int:
    if args.gpu_gib is not None:
        if args.gpu_gib <= 0:
            raise UsageError(f"--gpu-gib must be a positive number, got {args.gpu_gib!r}")
        return gib_to_bytes(args.gpu_gib)
    if gb is None:
        raise UsageError(
            f"profile {plan_name!r} has no gpu_total_gb; give the GPU's memory with --gpu-gib"
        )
    return gib_to_bytes(gb)


def _command_text(item: PlannedInstance) -> str:
    env = " ".join(f"{key}={value}" for key, value in item.env.items())
    return f"{env} {shlex.join(item.argv)}" if env else shlex.join(item.argv)


def _profile_instance_json(item: PlannedInstance) -> JsonDict:
    planned = item.planned
    spec = item.spec
    return {
        "backend": item.backend,
        "gpu": item.gpu,
        "lifecycle": item.config.lifecycle,
        "model": planned.model.name,
        "description": planned.source,
        "vram_pct": item.vram_pct,
        "vram_mib": item.config.vram_mib,
        "weights": planned.weights_source,
        "weights_gib": gib3(spec.weight_bytes),
        "kv_dtype": planned.kv_dtype.name,
        "kv_bytes_per_token": planned.kv_bytes_per_token,
        "max_model_len": planned.max_model_len,
        "max_num_seqs": planned.max_num_seqs,
        "kv_budget_gib": gib3(spec.kv_bytes),
        "cuda_graphs": not spec.enforce_eager,
        "graphs_gib": gib3(spec.graphs),
        "graphs_in_budget": spec.graphs_in_budget,
        "overhead_gib": gib3(spec.overhead_bytes),
        "cuda_context_gib": gib3(spec.cuda_context_bytes),
        "sleep_mode": item.sleep_mode,
        **instance_json(item.plan),
        "expected_used_mib": ceil_mib(item.plan.expected_used_bytes),
        "command": _command_text(item),
        "argv": list(item.argv),
        "env": item.env,
    }


def _profile_json(plan: ProfilePlan, gpu_source: str) -> JsonDict:
    return {
        "profile": None if plan.implicit else plan.name,
        "implicit": plan.implicit,  # no gpu_profiles.yaml: every backend as one profile
        "active": plan.active,
        "gpu_total_gib": gib3(plan.total_bytes),
        "gpu_total_source": gpu_source,
        "target_utilization_pct": plan.profile.target_utilization_pct,
        "fits": plan.fits,
        "complete": plan.complete,
        "problems": list(plan.problems),
        "instances": [_profile_instance_json(item) for item in plan.instances],
        "gpus": [
            {
                "gpu": gpu.gpu,
                "held_by_undescribed_gib": gib3(gpu.held_bytes),
                "used_gib": gib3(gpu.used_bytes),
                "used_pct": round(100 * gpu.used_bytes / plan.total_bytes, 1),
                "free_gib": gib3(plan.total_bytes - gpu.used_bytes),
                "fits": gpu.fits,
            }
            for gpu in plan.gpus
        ],
        "not_planned": [
            {
                "backend": item.backend,
                "missing": item.missing,
                "counted_mib": item.footprint.mib if item.footprint else None,
                "counted_from": item.footprint.source if item.footprint else None,
            }
            for item in plan.unplanned
        ],
        "disabled": list(plan.disabled),
    }


def _profile_table(plan: ProfilePlan, gpu_source: str, settings: Settings) -> str:
    profile = plan.profile
    many = len(plan.gpus) > 1
    if plan.implicit:
        head = (
            f"no {PROFILES_FILE}: every backend of models.yaml planned as one profile, "
            f"{bytes_to_gib(plan.total_bytes):.2f} GiB per GPU ({gpu_source}), no target "
            "below the whole GPU"
        )
    else:
        head = (
            f"profile {plan.name}{' (active)' if plan.active else ''}: "
            f"{bytes_to_gib(plan.total_bytes):.2f} GiB per GPU ({gpu_source}), "
            f"target {profile.target_utilization_pct:g}%"
        )
    lines = [
        head,
        "instances in start order (pinned first; lazy ones as if all were running):",
        "",
    ]
    header = ["backend", "lifecycle", "ok", "util", "kv-cache-memory-bytes", "KV GiB"]
    header += ["used GiB", "free after"]
    if many:
        header.insert(1, "gpu")
    body = []
    for item in plan.instances:
        row = [
            item.backend,
            item.config.lifecycle,
            "yes" if item.plan.ok else "NO",
            item.plan.flags[1],
            str(item.plan.kv_cache_memory_bytes or "-"),
            f"{bytes_to_gib(item.plan.kv_bytes):.2f}",
            f"{bytes_to_gib(item.plan.expected_used_bytes):.2f}",
            f"{bytes_to_gib(item.plan.free_after_bytes):.2f}",
        ]
        if many:
            row.insert(1, str(item.gpu))
        body.append(row)
    if body:
        lines += [table(header, body), ""]
    for item in plan.instances:
        planned = item.planned
        lines.append(f"{item.backend}{f' (GPU {item.gpu})' if many else ''}: {planned.source}")
        lines.append(f"  {_command_text(item)}")
        lines.append(
            f"  weights {bytes_to_gib(item.spec.weight_bytes):.2f} GiB ({planned.weights_source}"
            f"), KV at least {bytes_to_gib(item.spec.kv_bytes):.2f} GiB (one request of "
            f"{planned.max_model_len:,} tokens, {planned.kv_dtype.name}), CUDA graphs "
            f"{bytes_to_gib(item.spec.graphs):.2f} GiB"
        )
        if item.plan.max_concurrency is not None and item.plan.runs:
            lines.append(
                f"  KV cache {bytes_to_gib(item.plan.kv_bytes):.2f} GiB: maximum concurrency "
                f"{item.plan.max_concurrency:.2f}x for {planned.max_model_len:,} tokens per "
                "request"
            )
        chosen = chosen_note(settings, item.backend)
        if chosen is not None:
            lines.append(f"  note: {chosen}")
        if item.sleep_mode:
            lines.append("  note: sleep mode needs VLLM_SERVER_DEV_MODE=1 in the server's env")
        if item.config.vram_mib is not None:
            lines.append(
                f"  note: admission uses its vram_mib {item.config.vram_mib} MiB; the plan "
                f"expects {ceil_mib(item.plan.expected_used_bytes)} MiB"
            )
        lines.extend(f"  problem: {text}" for text in item.plan.problems)
        lines.extend(f"  note: {text}" for text in item.plan.notes)
        lines.extend(f"  advice: {text}" for text in item.plan.advice)
    for unplanned in plan.unplanned:
        counted = (
            f"{unplanned.footprint.mib} MiB ({unplanned.footprint.source}) counted as in use "
            "before the others start"
            if unplanned.footprint is not None
            else "its memory is NOT counted"
        )
        lines.append(f"not planned: {unplanned.backend}: {unplanned.missing}; {counted}")
    if plan.disabled:
        lines.append(f"disabled by the profile: {', '.join(plan.disabled)}")
    for gpu in plan.gpus:
        lines.append(
            f"{f'GPU {gpu.gpu}: ' if many else ''}used {bytes_to_gib(gpu.used_bytes):.2f} GiB "
            f"({100 * gpu.used_bytes / plan.total_bytes:.1f}%), free "
            f"{bytes_to_gib(plan.total_bytes - gpu.used_bytes):.2f} GiB"
        )
    if plan.fits:
        verdict = "fits: yes" if plan.complete else "fits: yes, for the memory that is known"
    else:
        verdict = "fits: NO\n" + "\n".join(f"  why: {text}" for text in plan.problems)
    lines.append(verdict)
    return "\n".join(lines)


def _all_backends(args: argparse.Namespace, settings: Settings) -> int:
    """No gpu_profiles.yaml: every backend as one profile on the --gpu-gib GPU."""
    missing = settings.config_dir / PROFILES_FILE
    if args.name is not None:
        raise UsageError(f"profile {args.name!r}: there is no {missing}")
    if args.gpu_gib is None:
        raise UsageError(
            f"there is no {missing}; give the GPU's memory with --gpu-gib to plan every "
            "backend of models.yaml as one profile"
        )
    total = _profile_gpu_bytes(args, "", None)
    plan = plan_all_backends(settings, total_bytes=total)
    text = _profile_table(plan, "--gpu-gib", settings)
    data = _profile_json(plan, "--gpu-gib")
    return emit_plan(args, data, text, fits=plan.fits)


def run_profile(args: argparse.Namespace) -> int:
    """``plan profile``: a GPU profile's instances, their vLLM flags, and whether they fit."""
    settings = load_config(args.config)
    profiles = settings.gpu_profiles
    if profiles is None:
        return _all_backends(args, settings)
    name = args.name if args.name is not None else profiles.default
    profile = profiles.profiles.get(name)
    if profile is None:
        raise UsageError(f"unknown profile {name!r} (profiles: {', '.join(profiles.profiles)})")
    total = _profile_gpu_bytes(args, name, profile.gpu_total_gb)
    gpu_source = "--gpu-gib" if args.gpu_gib is not None else "the profile's gpu_total_gb"
    plan = plan_profile(settings, name, total_bytes=total)
    text = _profile_table(plan, gpu_source, settings)
    return emit_plan(args, _profile_json(plan, gpu_source), text, fits=plan.fits)

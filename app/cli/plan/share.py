"""`plan share`: several vLLM instances on one GPU. Parses the `--instance` specs and
prints the flags that let them start one after another.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from app.cli.common import JsonDict, UsageError, emit_plan
from app.cli.plan.model_args import (
    derive_weights,
)
from app.cli.plan.render import gib3, table
from app.planner.catalog import catalog_model
from app.planner.kv import (
    kv_bytes_per_token,
    kv_cache_bytes,
    one_request_kv_bytes,
    parse_kv_dtype,
)
from app.planner.share import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    DEFAULT_INSTANCE_OVERHEAD_BYTES,
    KV_MODES,
    InstancePlan,
    InstanceSpec,
    KvMode,
    SharePlan,
    ShareRequest,
    plan_share,
)
from app.planner.units import bytes_to_gib, gib_to_bytes
from app.planner.weights import params_from_billions, served_dtype

T = TypeVar("T")


_FLAG_KEYS = {"eager", "enforce-eager", "kv-bytes", "graphs-outside-budget"}


_VALUE_KEYS = {
    "name",
    "weights-gib",
    "params-b",
    "weight-dtype",
    "model",
    "kv-gib",
    "context",
    "seqs",
    "bytes-per-token",
    "kv-dtype",
    "graphs-gib",
    "overhead-gib",
    "cuda-context-gib",
    "util",
    "gpu-memory-utilization",
    "mode",
}


def _split_spec(text: str, where: str) -> tuple[dict[str, str], set[str]]:
    values: dict[str, str] = {}
    flags: set[str] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            if key not in _FLAG_KEYS:
                raise UsageError(f"{where}: {item!r} is not a known flag or key=value item")
            flags.add(key)
            continue
        if key not in _VALUE_KEYS:
            known = ", ".join(sorted(_VALUE_KEYS | _FLAG_KEYS))
            raise UsageError(f"{where}: unknown key {key!r} (known: {known})")
        if key in values:
            raise UsageError(f"{where}: {key} given twice")
        values[key] = value.strip()
    return values, flags


def _parsed(
    values: dict[str, str], key: str, where: str, parse: Callable[[str], T], kind: str
) -> T | None:
    text = values.get(key)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        raise UsageError(f"{where}: {key} must be {kind}, got {text!r}") from None


def _number(values: dict[str, str], key: str, where: str) -> float | None:
    return _parsed(values, key, where, float, "a number")


def _integer(values: dict[str, str], key: str, where: str) -> int | None:
    return _parsed(values, key, where, int, "an integer")


def _gib_value(values: dict[str, str], key: str, where: str) -> int | None:
    number = _number(values, key, where)
    return None if number is None else gib_to_bytes(number)


def parse_instance_spec(
    text: str, index: int, *, graphs_outside_budget: bool = False
) -> InstanceSpec:
    """Parse one ``--instance`` value (see ``plan share --help``).

    `graphs_outside_budget` (``--graphs-outside-budget``) applies to every instance; an
    instance's own ``graphs-outside-budget`` flag to that one.
    """
    where = f"--instance #{index}"
    values, flags = _split_spec(text, where)
    name = values.get("name") or f"instance-{index}"
    where = f"--instance {name!r}"
    model = catalog_model(values["model"]) if "model" in values else None
    weight = _gib_value(values, "weights-gib", where)
    params_b = _number(values, "params-b", where)
    if weight is None:
        params = params_from_billions(params_b) if params_b is not None else None
        if params is None and (model is None or model.params is None):
            raise UsageError(f"{where}: give weights-gib, params-b or a catalog model")
        dtype = values.get("weight-dtype") or served_dtype(model.torch_dtype if model else None)
        weight = derive_weights(params, dtype, model)[0]
    elif params_b is not None:
        raise UsageError(f"{where}: give weights-gib or params-b, not both")
    kv = _gib_value(values, "kv-gib", where)
    context = _integer(values, "context", where)
    vllm_check: dict[str, int] = {}
    if kv is None:
        if context is None:
            raise UsageError(f"{where}: give kv-gib, or context (+ seqs) to derive it")
        per_token = _integer(values, "bytes-per-token", where)
        if per_token is None:
            if model is None:
                raise UsageError(f"{where}: context needs bytes-per-token or a catalog model")
            dtype_name = values.get("kv-dtype", "auto")
            per_token = kv_bytes_per_token(
                model.shape, parse_kv_dtype(dtype_name, model_dtype=model.torch_dtype or "bf16")
            )
        seqs = _integer(values, "seqs", where) or 1
        # vLLM needs at least one request of `context` tokens in whole blocks (kv.py).
        kv = max(kv_cache_bytes(per_token, context, seqs), one_request_kv_bytes(per_token, context))
        vllm_check = {"max_model_len": context, "kv_bytes_per_token": per_token}
    elif context is not None:
        raise UsageError(f"{where}: give kv-gib or context, not both")
    util = _number(values, "util", where)
    pinned = _number(values, "gpu-memory-utilization", where)
    if util is not None and pinned is not None:
        raise UsageError(f"{where}: util and gpu-memory-utilization mean the same thing")
    mode_text = values.get("mode", "kv-bytes" if "kv-bytes" in flags else "auto")
    mode = _kv_mode(mode_text, where)
    graphs = _gib_value(values, "graphs-gib", where)
    overhead = _gib_value(values, "overhead-gib", where)
    ctx = _gib_value(values, "cuda-context-gib", where)
    try:
        return InstanceSpec(
            name=name,
            weight_bytes=weight,
            kv_bytes=kv,
            graph_bytes=graphs if graphs is not None else 0,
            overhead_bytes=overhead if overhead is not None else DEFAULT_INSTANCE_OVERHEAD_BYTES,
            cuda_context_bytes=ctx if ctx is not None else DEFAULT_CUDA_CONTEXT_BYTES,
            enforce_eager=bool(flags & {"eager", "enforce-eager"}),
            gpu_memory_utilization=util if util is not None else pinned,
            kv_mode=mode,
            graphs_in_budget=not (graphs_outside_budget or "graphs-outside-budget" in flags),
            **vllm_check,
        )
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from exc


def _kv_mode(text: str, where: str) -> KvMode:
    for mode in KV_MODES:
        if text == mode:
            return mode
    raise UsageError(f"{where}: mode must be one of {', '.join(KV_MODES)}, got {text!r}")


def instance_json(plan: InstancePlan) -> JsonDict:
    data: JsonDict = {
        "name": plan.name,
        "ok": plan.ok,
        "runs": plan.runs,
        "mode": plan.mode,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
    }
    if plan.kv_cache_memory_bytes is not None:
        data["kv_cache_memory_bytes"] = plan.kv_cache_memory_bytes
    data.update(
        flags=list(plan.flags),
        free_at_start_gib=gib3(plan.free_at_start_bytes),
        requested_gib=gib3(plan.requested_bytes),
        kv_cache_gib=gib3(plan.kv_bytes),
        max_concurrency=(None if plan.max_concurrency is None else round(plan.max_concurrency, 2)),
        expected_used_gib=gib3(plan.expected_used_bytes),
        free_after_gib=gib3(plan.free_after_bytes),
        problems=list(plan.problems),
        notes=list(plan.notes),
        advice=list(plan.advice),
    )
    return data


def _share_table(plan: SharePlan) -> str:
    header = ["instance", "ok", "mode", "util", "kv-cache-memory-bytes", "KV GiB", "used GiB"]
    header.append("free after")
    body = [
        [
            item.name,
            "yes" if item.ok else "NO",
            item.mode,
            item.flags[1],
            str(item.kv_cache_memory_bytes) if item.kv_cache_memory_bytes is not None else "-",
            f"{bytes_to_gib(item.kv_bytes):.2f}",
            f"{bytes_to_gib(item.expected_used_bytes):.2f}",
            f"{bytes_to_gib(item.free_after_bytes):.2f}",
        ]
        for item in plan.instances
    ]
    lines = [
        f"GPU {bytes_to_gib(plan.total_bytes):.2f} GiB, "
        f"{bytes_to_gib(plan.baseline_used_bytes):.2f} GiB in use before the first instance",
        "",
        table(header, body),
    ]
    for item in plan.instances:
        lines.append(f"{item.name}: vllm serve ... {' '.join(item.flags)}")
        if item.max_concurrency is not None and item.runs:
            lines.append(
                f"  KV cache {bytes_to_gib(item.kv_bytes):.2f} GiB: maximum concurrency "
                f"{item.max_concurrency:.2f}x for full-context requests"
            )
        lines.extend(f"  problem: {text}" for text in item.problems)
        lines.extend(f"  note: {text}" for text in item.notes)
        lines.extend(f"  advice: {text}" for text in item.advice)
    lines.extend(f"problem: {text}" for text in plan.problems)
    lines.append(
        f"free at the end: {bytes_to_gib(plan.free_bytes):.2f} GiB; "
        f"fits: {'yes' if plan.fits else 'NO'}"
    )
    return "\n".join(lines)


def run_share(args: argparse.Namespace) -> int:
    """``plan share``: flags for several vLLM instances started one after another."""
    specs = tuple(
        parse_instance_spec(text, index, graphs_outside_budget=args.graphs_outside_budget)
        for index, text in enumerate(args.instance, start=1)
    )
    request = ShareRequest(
        total_bytes=gib_to_bytes(args.gpu_gib),
        instances=specs,
        baseline_used_bytes=gib_to_bytes(args.baseline_gib),
        reserve_bytes=gib_to_bytes(args.reserve_gib),
        legacy_accounting=args.legacy_accounting,
        utilization_step=args.utilization_step,
    )
    plan = plan_share(request)
    data: JsonDict = {
        "total_gib": gib3(plan.total_bytes),
        "baseline_gib": gib3(plan.baseline_used_bytes),
        "instances": [instance_json(item) for item in plan.instances],
        "free_gib": gib3(plan.free_bytes),
        "fits": plan.fits,
        "problems": list(plan.problems),
    }
    return emit_plan(args, data, _share_table(plan), fits=plan.fits)

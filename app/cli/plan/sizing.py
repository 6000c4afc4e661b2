"""`plan kv`, `plan context` and `plan gpus`: KV-cache bytes, the longest context that
fits, and the fewest GPUs for a context.
"""

from __future__ import annotations

import argparse

from app.cli.common import JsonDict, UsageError, emit, emit_plan
from app.cli.plan.model_args import (
    kv_dtype,
    resolve_model,
    shape_json,
    shape_text,
    sizing_inputs,
)
from app.cli.plan.render import gib3, key_values
from app.planner.kv import (
    kv_bytes_per_token,
    kv_cache_bytes,
)
from app.planner.model_info import ModelInfo
from app.planner.sizing import (
    plan_max_context,
    plan_min_gpus,
)
from app.planner.units import KIB, bytes_to_gib


def run_kv(args: argparse.Namespace) -> int:
    """``plan kv``: bytes per token, and the cache for ``--context`` x ``--seqs``."""
    model = resolve_model(args, required=True)
    assert model is not None
    dtype = kv_dtype(args, model)
    per_token = kv_bytes_per_token(model.shape, dtype)
    data: JsonDict = {"model": model.name, "kv_dtype": dtype.name, **shape_json(model)}
    data["kv_bytes_per_token"] = per_token
    rows = [
        ("model", f"{model.name} ({shape_text(model)})"),
        ("kv dtype", dtype.name),
        ("kv_bytes_per_token", f"{per_token:,} ({per_token / KIB:.2f} KiB)"),
    ]
    if args.context is not None:
        total = kv_cache_bytes(per_token, args.context, args.seqs)
        data.update(
            context=args.context,
            seqs=args.seqs,
            kv_cache_bytes=total,
            kv_cache_gib=gib3(total),
        )
        rows.append(
            (
                "kv_cache_bytes",
                f"{total:,} ({bytes_to_gib(total):.2f} GiB) for {args.context:,} tokens "
                f"x {args.seqs} seq(s)",
            )
        )
    elif args.seqs != 1:
        raise UsageError("--seqs needs --context")
    return emit(args, data, key_values(rows))


def run_context(args: argparse.Namespace) -> int:
    """``plan context``: the longest ``--max-model-len`` that fits."""
    model, inputs, facts = sizing_inputs(args)
    limit: int | None = args.model_limit
    if limit is None and model is not None:
        limit = model.max_context
    plan = plan_max_context(**inputs, gpus=args.gpus, model_limit=limit)
    budget = plan.budget
    heads = _attention_heads(args, model)
    refused = heads is not None and heads % args.gpus != 0
    data: JsonDict = {
        "max_context_tokens": plan.max_context_tokens,
        "raw_tokens": plan.raw_tokens,
        "model_limit": plan.model_limit,
        "clamped": plan.clamped,
        "gpus": args.gpus,
        "kv_shards": budget.kv_shards,
        **facts,
        "usable_gib_per_gpu": gib3(budget.usable_bytes),
        "weights_gib_per_gpu": gib3(budget.weight_bytes),
        "overhead_gib_per_gpu": gib3(budget.overhead_bytes),
        "remaining_gib_per_gpu": gib3(budget.remaining_bytes),
        "reason": plan.reason,
        "attention_heads": heads,
        "tensor_parallel_ok": None if heads is None else not refused,
    }
    rows = [
        ("max_context_tokens", f"{plan.max_context_tokens:,}"),
        ("why", plan.reason),
        ("GPUs / KV shards", f"{args.gpus} / {budget.kv_shards}"),
        (
            "kv bytes per token",
            f"{inputs['kv_bytes_per_token']:,} ({budget.kv_bytes_per_token:,.0f} per GPU)",
        ),
        ("usable per GPU", f"{bytes_to_gib(budget.usable_bytes):.2f} GiB"),
        (
            "weights per GPU",
            f"{bytes_to_gib(budget.weight_bytes):.2f} GiB ({facts['weights_source']}, x "
            f"{args.weight_expansion:g})",
        ),
        ("overhead per GPU", f"{bytes_to_gib(budget.overhead_bytes):.2f} GiB"),
        ("left for KV per GPU", f"{bytes_to_gib(budget.remaining_bytes):.2f} GiB"),
        ("model limit", f"{plan.model_limit:,}" if plan.model_limit else "none"),
    ]
    if refused:
        rows.append(
            (
                "warning",
                f"vLLM refuses --tensor-parallel-size {args.gpus}: it does not divide the "
                f"model's {heads} attention heads (vllm/config/model.py)",
            )
        )
    return emit(args, data, key_values(rows))


def _attention_heads(args: argparse.Namespace, model: ModelInfo | None) -> int | None:
    heads: int | None = args.attention_heads
    if heads is not None:
        if heads <= 0:
            raise UsageError(f"--attention-heads must be a positive integer, got {heads}")
        return heads
    return None if model is None else model.attention_heads


def run_gpus(args: argparse.Namespace) -> int:
    """``plan gpus``: the fewest GPUs and nodes for ``--context`` tokens."""
    model, inputs, facts = sizing_inputs(args)
    heads = _attention_heads(args, model)
    plan = plan_min_gpus(
        **inputs,
        context_tokens=args.context,
        gpus_per_node=args.gpus_per_node,
        max_gpus=args.max_gpus,
        attention_heads=heads,
    )
    needed = plan.needed_bytes_per_gpu
    data: JsonDict = {
        "min_gpus": plan.min_gpus,
        "min_nodes": plan.min_nodes,
        "fits": plan.fits,
        "tensor_parallel_size": plan.tensor_parallel,
        "pipeline_parallel_size": plan.pipeline_parallel,
        "memory_gpus": plan.memory_gpus,
        "attention_heads": heads,
        "gpus_per_node": plan.gpus_per_node,
        "context_tokens": plan.context_tokens,
        **facts,
        "needed_gib_per_gpu": None if needed is None else gib3(needed),
        "usable_gib_per_gpu": gib3(plan.usable_bytes_per_gpu),
        "reason": plan.reason,
    }
    layout = "-"
    if plan.tensor_parallel is not None:
        layout = f"--tensor-parallel-size {plan.tensor_parallel}"
        if plan.pipeline_parallel != 1:
            layout += f" --pipeline-parallel-size {plan.pipeline_parallel}"
    rows = [
        ("min_gpus", str(plan.min_gpus) if plan.min_gpus is not None else "none fits"),
        ("min_nodes", str(plan.min_nodes) if plan.min_nodes is not None else "-"),
        ("vllm flags", layout),
        ("why", plan.reason),
        ("context", f"{plan.context_tokens:,} tokens"),
        ("weights", f"{bytes_to_gib(inputs['weight_bytes']):.2f} GiB ({facts['weights_source']})"),
    ]
    return emit_plan(args, data, key_values(rows), fits=plan.fits)

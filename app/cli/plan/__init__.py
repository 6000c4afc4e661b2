"""``microscheduler plan ...``: the command-line face of the GPU memory planners.

The only module of the planners that reads files (``--hf-config``) and prints. The main CLI
adds the command with :func:`add_plan_command` and runs ``sys.exit(args.func(args))``; every
handler returns 0 on success and 2 on bad input, after one ``error: ...`` line on stderr.
A plan that does not fit is still a successful answer (exit 0, ``"fits": false``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from app.planner.catalog import catalog_model, catalog_names
from app.planner.description import read_hf_config
from app.planner.footprint import ceil_mib
from app.planner.kv import (
    AttentionShape,
    KvDtype,
    kv_bytes_per_token,
    kv_cache_bytes,
    parse_kv_dtype,
)
from app.planner.model_info import ModelInfo
from app.planner.profile_plan import PlannedInstance, ProfilePlan, plan_profile
from app.planner.share import (
    DEFAULT_CUDA_CONTEXT_BYTES,
    DEFAULT_INSTANCE_OVERHEAD_BYTES,
    DEFAULT_UTILIZATION_STEP,
    KV_MODES,
    InstancePlan,
    InstanceSpec,
    KvMode,
    SharePlan,
    ShareRequest,
    plan_share,
)
from app.planner.sizing import (
    DEFAULT_ALIGNMENT,
    DEFAULT_MAX_GPUS,
    DEFAULT_SIZING_CONTEXT,
    DEFAULT_UTILIZATION,
    DEFAULT_WEIGHT_EXPANSION,
    SizingConstants,
    plan_max_context,
    plan_min_gpus,
)
from app.planner.units import GIB, KIB, bytes_to_gib, gib_to_bytes
from app.planner.weights import estimate_weight_bytes, params_from_billions, served_dtype
from app.settings import PROFILES_FILE, ConfigError, Settings, load_settings

T = TypeVar("T")

Handler = Callable[[argparse.Namespace], int]
JsonDict = dict[str, Any]


class PlanInputError(ValueError):
    """Bad command-line input that is not caught by argparse itself."""


# --------------------------------------------------------------------------- parser


def add_plan_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plan`` with its ``kv``, ``context``, ``gpus``, ``share`` and ``profile`` commands."""
    plan = subparsers.add_parser(
        "plan",
        help="size KV caches, context lengths, GPU counts and shared-GPU vLLM flags",
        description="GPU memory planning for vLLM instances (no GPU needed).",
    )
    commands = plan.add_subparsers(
        dest="plan_command", metavar="{kv,context,gpus,share,profile}", required=True
    )

    kv = commands.add_parser(
        "kv",
        help="KV-cache bytes per token (and for a context x sequences)",
        description="KV-cache size: 2 x layers x kv_heads x head_dim x bytes per element "
        "(MLA: layers x (kv_lora_rank + rope_head_dim) x bytes).",
    )
    _add_model_args(kv)
    kv.add_argument("--context", type=int, help="tokens per sequence")
    kv.add_argument("--seqs", type=int, default=1, help="concurrent sequences (default 1)")
    _add_json_arg(kv)
    kv.set_defaults(func=_guarded(run_kv))

    context = commands.add_parser(
        "context",
        help="longest context (--max-model-len) that fits on N GPUs (KAITO's method)",
        description="usable = GPU x utilization; remaining = usable - weights x 1.02 / N - "
        "overhead; tokens = remaining / (bytes per token / N), clamped and aligned to 256.",
    )
    _add_sizing_args(context)
    context.add_argument("--gpus", type=int, default=1, help="GPUs (tensor parallel), default 1")
    context.add_argument(
        "--model-limit", type=int, help="context limit (default: the model's max positions)"
    )
    _add_json_arg(context)
    context.set_defaults(func=_guarded(run_context))

    gpus = commands.add_parser(
        "gpus",
        help="fewest GPUs and nodes that hold a model and its KV cache",
        description="smallest N with weights x 1.02 / N + overhead + context x bytes per "
        "token / N <= usable; nodes = ceil(N / GPUs per node).",
    )
    _add_sizing_args(gpus)
    gpus.add_argument(
        "--context",
        type=int,
        default=DEFAULT_SIZING_CONTEXT,
        help=f"context to size for (default {DEFAULT_SIZING_CONTEXT})",
    )
    gpus.add_argument("--gpus-per-node", type=int, default=1, help="default 1")
    gpus.add_argument(
        "--max-gpus",
        type=int,
        default=DEFAULT_MAX_GPUS,
        help=f"search limit (default {DEFAULT_MAX_GPUS})",
    )
    _add_json_arg(gpus)
    gpus.set_defaults(func=_guarded(run_gpus))

    share = commands.add_parser(
        "share",
        help="--gpu-memory-utilization / --kv-cache-memory-bytes for vLLM instances sharing a GPU",
        description="Instances are started in the order given. Each --instance is a comma-"
        "separated list of key=value items and flags: name, weights-gib | params-b [+ "
        "weight-dtype] | model, kv-gib | context [+ seqs] + (bytes-per-token | model "
        "[+ kv-dtype]), graphs-gib, eager, overhead-gib (default "
        f"{bytes_to_gib(DEFAULT_INSTANCE_OVERHEAD_BYTES):g}), cuda-context-gib (default "
        f"{bytes_to_gib(DEFAULT_CUDA_CONTEXT_BYTES):g}), util (check a given "
        "--gpu-memory-utilization), mode=auto|utilization|kv-bytes (kv-bytes alone = "
        "mode=kv-bytes: use --kv-cache-memory-bytes).",
    )
    share.add_argument("--gpu-gib", type=float, required=True, help="GPU memory in GiB")
    share.add_argument(
        "--instance",
        action="append",
        required=True,
        metavar="SPEC",
        help="e.g. name=A,weights-gib=6.4,kv-gib=1.6,graphs-gib=8,overhead-gib=4.7",
    )
    share.add_argument(
        "--baseline-gib",
        type=float,
        default=0.0,
        help="memory other processes hold before the first instance starts",
    )
    share.add_argument(
        "--reserve-gib", type=float, default=0.0, help="memory that must stay free at the end"
    )
    share.add_argument(
        "--graphs-in-budget",
        action="store_true",
        help="vLLM counts CUDA graphs in its budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
    )
    share.add_argument(
        "--legacy-accounting",
        action="store_true",
        help="vLLM before PR #18974: memory held by others is charged to the new instance",
    )
    share.add_argument(
        "--utilization-step",
        type=float,
        default=DEFAULT_UTILIZATION_STEP,
        help=f"grid for chosen utilizations (default {DEFAULT_UTILIZATION_STEP})",
    )
    _add_json_arg(share)
    share.set_defaults(func=_guarded(run_share))

    profile = commands.add_parser(
        "profile",
        help="does a GPU profile fit, and the vLLM command line of each of its instances",
        description="For a profile of gpu_profiles.yaml (default: the active one) and the "
        "backends' model descriptions (model_info: / hf_config: in models.yaml): each enabled "
        "instance in start order (pinned first), its planned memory and vLLM command line, "
        "and whether they fit on the GPU together.",
    )
    profile.add_argument(
        "name", nargs="?", help="the profile (default: active: in gpu_profiles.yaml)"
    )
    profile.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config directory (default: $MICROSCHEDULER_CONFIG_DIR or config/)",
    )
    profile.add_argument(
        "--gpu-gib", type=float, help="GPU memory in GiB (default: the profile's gpu_total_gb)"
    )
    _add_json_arg(profile)
    profile.set_defaults(func=_guarded(run_profile))


def _add_json_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (one of --model, --hf-config or shape flags)")
    group.add_argument("--model", help=f"catalog model: {', '.join(catalog_names())}")
    group.add_argument("--hf-config", help="path to a Hugging Face config.json (or its folder)")
    group.add_argument("--layers", type=int, help="num_hidden_layers")
    group.add_argument("--kv-heads", type=int, help="num_key_value_heads")
    group.add_argument("--head-dim", type=int, help="head_dim")
    group.add_argument("--kv-lora-rank", type=int, help="MLA: kv_lora_rank")
    group.add_argument("--rope-head-dim", type=int, help="MLA: qk_rope_head_dim")
    group.add_argument(
        "--kv-dtype",
        default="auto",
        help="fp16, bf16, fp32, fp8, tqN, tqKkVv (default auto: the model's dtype)",
    )


def _add_sizing_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-gib", type=float, required=True, help="memory per GPU in GiB")
    weights = parser.add_argument_group("weights (--weights-gib, or derived from parameters)")
    weights.add_argument("--weights-gib", type=float, help="checkpoint size in GiB")
    weights.add_argument("--params-b", type=float, help="parameters in billions")
    weights.add_argument(
        "--weight-dtype",
        help="fp32, bf16, fp16, fp8, int8, int4, awq, gptq (default: the model's dtype)",
    )
    parser.add_argument(
        "--bytes-per-token", type=int, help="KV bytes per token (instead of model flags)"
    )
    _add_model_args(parser)
    tunables = parser.add_argument_group("KAITO constants")
    tunables.add_argument(
        "--utilization",
        type=float,
        default=DEFAULT_UTILIZATION,
        help=f"usable fraction of GPU memory (default {DEFAULT_UTILIZATION})",
    )
    tunables.add_argument(
        "--overhead-gib", type=float, default=2.3, help="fixed overhead per GPU (default 2.3)"
    )
    tunables.add_argument(
        "--overhead-weight-fraction",
        type=float,
        default=0.0,
        help="extra overhead per GiB of weights per GPU (KAITO #2139 uses 0.05; default 0)",
    )
    tunables.add_argument(
        "--weight-expansion",
        type=float,
        default=DEFAULT_WEIGHT_EXPANSION,
        help=f"runtime weights / checkpoint size (default {DEFAULT_WEIGHT_EXPANSION})",
    )
    tunables.add_argument(
        "--alignment",
        type=int,
        default=DEFAULT_ALIGNMENT,
        help=f"round the context down to a multiple of this (default {DEFAULT_ALIGNMENT})",
    )


# --------------------------------------------------------------------------- plumbing


def _guarded(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (ValueError, OSError) as exc:
            message = " ".join(str(exc).split())
            print(f"error: plan {args.plan_command}: {message}", file=sys.stderr)
            return 2

    run.__name__ = handler.__name__
    run.__doc__ = handler.__doc__
    return run


def _emit(args: argparse.Namespace, data: JsonDict, table: str) -> int:
    if args.json:
        print(json.dumps(data, sort_keys=False))
    else:
        print(table)
    return 0


def _gib3(n_bytes: float) -> float:
    return round(bytes_to_gib(n_bytes), 3)


def _rows(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    rows = [list(header), *(list(row) for row in body)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# --------------------------------------------------------------------------- model input


def _shape_flags_given(args: argparse.Namespace) -> bool:
    flags = (args.layers, args.kv_heads, args.head_dim, args.kv_lora_rank, args.rope_head_dim)
    return any(value is not None for value in flags)


def _shape_from_flags(args: argparse.Namespace) -> AttentionShape:
    if args.layers is None:
        raise PlanInputError("--layers is required with shape flags")
    if args.kv_lora_rank is not None or args.rope_head_dim is not None:
        if args.kv_lora_rank is None or args.rope_head_dim is None:
            raise PlanInputError("MLA needs both --kv-lora-rank and --rope-head-dim")
        return AttentionShape(
            layers=args.layers, kv_lora_rank=args.kv_lora_rank, rope_head_dim=args.rope_head_dim
        )
    missing = [
        flag
        for flag, value in (("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim))
        if value is None
    ]
    if missing:
        raise PlanInputError(f"{' and '.join(missing)} required with --layers")
    return AttentionShape(layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim)


def _resolve_model(args: argparse.Namespace, *, required: bool) -> ModelInfo | None:
    sources = [
        name
        for name, given in (
            ("--model", args.model is not None),
            ("--hf-config", args.hf_config is not None),
            ("shape flags", _shape_flags_given(args)),
        )
        if given
    ]
    if len(sources) > 1:
        raise PlanInputError(f"give only one of {' / '.join(sources)}")
    if args.model is not None:
        return catalog_model(args.model)
    if args.hf_config is not None:
        return read_hf_config(Path(args.hf_config))
    if sources:
        return ModelInfo(name="custom", shape=_shape_from_flags(args))
    if required:
        raise PlanInputError(
            "describe the model: --model NAME, --hf-config PATH, or "
            "--layers/--kv-heads/--head-dim (MLA: --layers/--kv-lora-rank/--rope-head-dim)"
        )
    return None


def _kv_dtype(args: argparse.Namespace, model: ModelInfo) -> KvDtype:
    return parse_kv_dtype(args.kv_dtype, model_dtype=model.torch_dtype or "bf16")


def _shape_json(model: ModelInfo) -> JsonDict:
    shape = model.shape
    if shape.is_mla:
        return {
            "layers": shape.layers,
            "mla": True,
            "kv_lora_rank": shape.kv_lora_rank,
            "rope_head_dim": shape.rope_head_dim,
        }
    return {
        "layers": shape.layers,
        "mla": False,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
    }


def _shape_text(model: ModelInfo) -> str:
    shape = model.shape
    if shape.is_mla:
        return (
            f"{shape.layers} layers, MLA latent {shape.kv_lora_rank} + rope {shape.rope_head_dim}"
        )
    return f"{shape.layers} layers x {shape.kv_heads} KV heads x head_dim {shape.head_dim}"


# --------------------------------------------------------------------------- plan kv


def run_kv(args: argparse.Namespace) -> int:
    """``plan kv``: bytes per token, and the cache for ``--context`` x ``--seqs``."""
    model = _resolve_model(args, required=True)
    assert model is not None
    dtype = _kv_dtype(args, model)
    per_token = kv_bytes_per_token(model.shape, dtype)
    data: JsonDict = {"model": model.name, "kv_dtype": dtype.name, **_shape_json(model)}
    data["kv_bytes_per_token"] = per_token
    rows = [
        ("model", f"{model.name} ({_shape_text(model)})"),
        ("kv dtype", dtype.name),
        ("kv_bytes_per_token", f"{per_token:,} ({per_token / KIB:.2f} KiB)"),
    ]
    if args.context is not None:
        total = kv_cache_bytes(per_token, args.context, args.seqs)
        data.update(
            context=args.context,
            seqs=args.seqs,
            kv_cache_bytes=total,
            kv_cache_gib=_gib3(total),
        )
        rows.append(
            (
                "kv_cache_bytes",
                f"{total:,} ({bytes_to_gib(total):.2f} GiB) for {args.context:,} tokens "
                f"x {args.seqs} seq(s)",
            )
        )
    elif args.seqs != 1:
        raise PlanInputError("--seqs needs --context")
    return _emit(args, data, _rows(rows))


# --------------------------------------------------------------------------- context / gpus


def _constants(args: argparse.Namespace) -> SizingConstants:
    return SizingConstants(
        utilization=args.utilization,
        weight_expansion=args.weight_expansion,
        overhead_bytes=args.overhead_gib * GIB,
        overhead_weight_fraction=args.overhead_weight_fraction,
        alignment=args.alignment,
    )


def _weights(args: argparse.Namespace, model: ModelInfo | None) -> tuple[int, str]:
    """Weight bytes and how they were obtained."""
    if args.weights_gib is not None:
        if args.params_b is not None:
            raise PlanInputError("give --weights-gib or --params-b, not both")
        return gib_to_bytes(args.weights_gib), "given"
    params = params_from_billions(args.params_b) if args.params_b is not None else None
    if params is None and (model is None or model.params is None):
        raise PlanInputError(
            "give --weights-gib, or --params-b (or a catalog --model) to derive the weights"
        )
    dtype = args.weight_dtype or served_dtype(model.torch_dtype if model else None)
    weight, count = _derive_weights(params, dtype, model)
    return weight, f"{count / 1e9:g}B params as {dtype}"


def _derive_weights(params: int | None, dtype: str, model: ModelInfo | None) -> tuple[int, int]:
    """Weight bytes and the parameter count used (``params`` wins over the model's)."""
    if model is not None:
        count = params if params is not None else model.params
        assert count is not None
        return model.weight_bytes(dtype, count), count
    assert params is not None
    return estimate_weight_bytes(params, dtype), params


def _sizing_inputs(args: argparse.Namespace) -> tuple[ModelInfo | None, int, int | None, JsonDict]:
    """Model, KV bytes per token, KV shard limit and JSON facts shared by context/gpus."""
    model = _resolve_model(args, required=args.bytes_per_token is None)
    facts: JsonDict = {}
    if args.bytes_per_token is not None:
        per_token = int(args.bytes_per_token)
        facts["kv_dtype"] = None
    else:
        assert model is not None
        dtype = _kv_dtype(args, model)
        per_token = kv_bytes_per_token(model.shape, dtype)
        facts["kv_dtype"] = dtype.name
    shard_limit = model.shape.kv_shard_limit if model is not None else None
    if model is not None:
        facts["model"] = model.name
    facts["kv_bytes_per_token"] = per_token
    return model, per_token, shard_limit, facts


def run_context(args: argparse.Namespace) -> int:
    """``plan context``: the longest ``--max-model-len`` that fits."""
    model, per_token, shard_limit, facts = _sizing_inputs(args)
    weight, weight_source = _weights(args, model)
    limit: int | None = args.model_limit
    if limit is None and model is not None:
        limit = model.max_context
    plan = plan_max_context(
        gpu_bytes=args.gpu_gib * GIB,
        weight_bytes=weight,
        kv_bytes_per_token=per_token,
        gpus=args.gpus,
        model_limit=limit,
        kv_shard_limit=shard_limit,
        constants=_constants(args),
    )
    budget = plan.budget
    data: JsonDict = {
        "max_context_tokens": plan.max_context_tokens,
        "raw_tokens": plan.raw_tokens,
        "model_limit": plan.model_limit,
        "clamped": plan.clamped,
        "gpus": args.gpus,
        "kv_shards": budget.kv_shards,
        **facts,
        "weights_gib": _gib3(weight),
        "weights_source": weight_source,
        "usable_gib_per_gpu": _gib3(budget.usable_bytes),
        "weights_gib_per_gpu": _gib3(budget.weight_bytes),
        "overhead_gib_per_gpu": _gib3(budget.overhead_bytes),
        "remaining_gib_per_gpu": _gib3(budget.remaining_bytes),
        "reason": plan.reason,
    }
    rows = [
        ("max_context_tokens", f"{plan.max_context_tokens:,}"),
        ("why", plan.reason),
        ("GPUs / KV shards", f"{args.gpus} / {budget.kv_shards}"),
        ("kv bytes per token", f"{per_token:,} ({budget.kv_bytes_per_token:,.0f} per GPU)"),
        ("usable per GPU", f"{bytes_to_gib(budget.usable_bytes):.2f} GiB"),
        (
            "weights per GPU",
            f"{bytes_to_gib(budget.weight_bytes):.2f} GiB ({weight_source}, x "
            f"{args.weight_expansion:g})",
        ),
        ("overhead per GPU", f"{bytes_to_gib(budget.overhead_bytes):.2f} GiB"),
        ("left for KV per GPU", f"{bytes_to_gib(budget.remaining_bytes):.2f} GiB"),
        ("model limit", f"{plan.model_limit:,}" if plan.model_limit else "none"),
    ]
    return _emit(args, data, _rows(rows))


def run_gpus(args: argparse.Namespace) -> int:
    """``plan gpus``: the fewest GPUs and nodes for ``--context`` tokens."""
    model, per_token, shard_limit, facts = _sizing_inputs(args)
    weight, weight_source = _weights(args, model)
    plan = plan_min_gpus(
        gpu_bytes=args.gpu_gib * GIB,
        weight_bytes=weight,
        kv_bytes_per_token=per_token,
        context_tokens=args.context,
        gpus_per_node=args.gpus_per_node,
        kv_shard_limit=shard_limit,
        max_gpus=args.max_gpus,
        constants=_constants(args),
    )
    needed = plan.needed_bytes_per_gpu
    data: JsonDict = {
        "min_gpus": plan.min_gpus,
        "min_nodes": plan.min_nodes,
        "fits": plan.fits,
        "gpus_per_node": plan.gpus_per_node,
        "context_tokens": plan.context_tokens,
        **facts,
        "weights_gib": _gib3(weight),
        "weights_source": weight_source,
        "needed_gib_per_gpu": None if needed is None else _gib3(needed),
        "usable_gib_per_gpu": _gib3(plan.usable_bytes_per_gpu),
        "reason": plan.reason,
    }
    rows = [
        ("min_gpus", str(plan.min_gpus) if plan.min_gpus is not None else "none fits"),
        ("min_nodes", str(plan.min_nodes) if plan.min_nodes is not None else "-"),
        ("why", plan.reason),
        ("context", f"{plan.context_tokens:,} tokens"),
        ("weights", f"{bytes_to_gib(weight):.2f} GiB ({weight_source})"),
    ]
    return _emit(args, data, _rows(rows))


# --------------------------------------------------------------------------- plan share

_FLAG_KEYS = {"eager", "enforce-eager", "kv-bytes"}
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
                raise PlanInputError(f"{where}: {item!r} is not a known flag or key=value item")
            flags.add(key)
            continue
        if key not in _VALUE_KEYS:
            known = ", ".join(sorted(_VALUE_KEYS | _FLAG_KEYS))
            raise PlanInputError(f"{where}: unknown key {key!r} (known: {known})")
        if key in values:
            raise PlanInputError(f"{where}: {key} given twice")
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
        raise PlanInputError(f"{where}: {key} must be {kind}, got {text!r}") from None


def _number(values: dict[str, str], key: str, where: str) -> float | None:
    return _parsed(values, key, where, float, "a number")


def _integer(values: dict[str, str], key: str, where: str) -> int | None:
    return _parsed(values, key, where, int, "an integer")


def _gib_value(values: dict[str, str], key: str, where: str) -> int | None:
    number = _number(values, key, where)
    return None if number is None else gib_to_bytes(number)


def parse_instance_spec(text: str, index: int) -> InstanceSpec:
    """Parse one ``--instance`` value (see ``plan share --help``)."""
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
            raise PlanInputError(f"{where}: give weights-gib, params-b or a catalog model")
        dtype = values.get("weight-dtype") or served_dtype(model.torch_dtype if model else None)
        weight = _derive_weights(params, dtype, model)[0]
    elif params_b is not None:
        raise PlanInputError(f"{where}: give weights-gib or params-b, not both")
    kv = _gib_value(values, "kv-gib", where)
    context = _integer(values, "context", where)
    if kv is None:
        if context is None:
            raise PlanInputError(f"{where}: give kv-gib, or context (+ seqs) to derive it")
        per_token = _integer(values, "bytes-per-token", where)
        if per_token is None:
            if model is None:
                raise PlanInputError(f"{where}: context needs bytes-per-token or a catalog model")
            dtype_name = values.get("kv-dtype", "auto")
            per_token = kv_bytes_per_token(
                model.shape, parse_kv_dtype(dtype_name, model_dtype=model.torch_dtype or "bf16")
            )
        kv = kv_cache_bytes(per_token, context, _integer(values, "seqs", where) or 1)
    elif context is not None:
        raise PlanInputError(f"{where}: give kv-gib or context, not both")
    util = _number(values, "util", where)
    pinned = _number(values, "gpu-memory-utilization", where)
    if util is not None and pinned is not None:
        raise PlanInputError(f"{where}: util and gpu-memory-utilization mean the same thing")
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
        )
    except ValueError as exc:
        raise PlanInputError(f"{where}: {exc}") from exc


def _kv_mode(text: str, where: str) -> KvMode:
    for mode in KV_MODES:
        if text == mode:
            return mode
    raise PlanInputError(f"{where}: mode must be one of {', '.join(KV_MODES)}, got {text!r}")


def _instance_json(plan: InstancePlan) -> JsonDict:
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
        free_at_start_gib=_gib3(plan.free_at_start_bytes),
        requested_gib=_gib3(plan.requested_bytes),
        kv_cache_gib=_gib3(plan.kv_bytes),
        expected_used_gib=_gib3(plan.expected_used_bytes),
        free_after_gib=_gib3(plan.free_after_bytes),
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
        _table(header, body),
    ]
    for item in plan.instances:
        lines.append(f"{item.name}: vllm serve ... {' '.join(item.flags)}")
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
        parse_instance_spec(text, index) for index, text in enumerate(args.instance, start=1)
    )
    request = ShareRequest(
        total_bytes=gib_to_bytes(args.gpu_gib),
        instances=specs,
        baseline_used_bytes=gib_to_bytes(args.baseline_gib),
        reserve_bytes=gib_to_bytes(args.reserve_gib),
        graphs_in_budget=args.graphs_in_budget,
        legacy_accounting=args.legacy_accounting,
        utilization_step=args.utilization_step,
    )
    plan = plan_share(request)
    data: JsonDict = {
        "total_gib": _gib3(plan.total_bytes),
        "baseline_gib": _gib3(plan.baseline_used_bytes),
        "instances": [_instance_json(item) for item in plan.instances],
        "free_gib": _gib3(plan.free_bytes),
        "fits": plan.fits,
        "problems": list(plan.problems),
    }
    return _emit(args, data, _share_table(plan))


# --------------------------------------------------------------------------- plan profile


def _load_config(directory: Path | None) -> Settings:
    try:
        return load_settings(directory)
    except ConfigError as exc:
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        raise PlanInputError(f"invalid configuration: {exc.problems[0]}{more}") from None


def _profile_gpu_bytes(args: argparse.Namespace, plan_name: str, gb: float | None) -> int:
    if args.gpu_gib is not None:
        if args.gpu_gib <= 0:
            raise PlanInputError(f"--gpu-gib must be a positive number, got {args.gpu_gib!r}")
        return gib_to_bytes(args.gpu_gib)
    if gb is None:
        raise PlanInputError(
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
        "weights_gib": _gib3(spec.weight_bytes),
        "kv_dtype": planned.kv_dtype.name,
        "kv_bytes_per_token": planned.kv_bytes_per_token,
        "max_model_len": planned.max_model_len,
        "max_num_seqs": planned.max_num_seqs,
        "kv_budget_gib": _gib3(spec.kv_bytes),
        "cuda_graphs": not spec.enforce_eager,
        "graphs_gib": _gib3(spec.graphs),
        "overhead_gib": _gib3(spec.overhead_bytes),
        "cuda_context_gib": _gib3(spec.cuda_context_bytes),
        "sleep_mode": item.sleep_mode,
        **_instance_json(item.plan),
        "expected_used_mib": ceil_mib(item.plan.expected_used_bytes),
        "command": _command_text(item),
        "argv": list(item.argv),
        "env": item.env,
    }


def _profile_json(plan: ProfilePlan, gpu_source: str) -> JsonDict:
    return {
        "profile": plan.name,
        "active": plan.active,
        "gpu_total_gib": _gib3(plan.total_bytes),
        "gpu_total_source": gpu_source,
        "target_utilization_pct": plan.profile.target_utilization_pct,
        "fits": plan.fits,
        "complete": plan.complete,
        "problems": list(plan.problems),
        "instances": [_profile_instance_json(item) for item in plan.instances],
        "gpus": [
            {
                "gpu": gpu.gpu,
                "held_by_undescribed_gib": _gib3(gpu.held_bytes),
                "used_gib": _gib3(gpu.used_bytes),
                "used_pct": round(100 * gpu.used_bytes / plan.total_bytes, 1),
                "free_gib": _gib3(plan.total_bytes - gpu.used_bytes),
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


def _profile_table(plan: ProfilePlan, gpu_source: str) -> str:
    profile = plan.profile
    many = len(plan.gpus) > 1
    lines = [
        f"profile {plan.name}{' (active)' if plan.active else ''}: "
        f"{bytes_to_gib(plan.total_bytes):.2f} GiB per GPU ({gpu_source}), "
        f"target {profile.target_utilization_pct:g}%",
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
        lines += [_table(header, body), ""]
    for item in plan.instances:
        planned = item.planned
        lines.append(f"{item.backend}{f' (GPU {item.gpu})' if many else ''}: {planned.source}")
        lines.append(f"  {_command_text(item)}")
        lines.append(
            f"  weights {bytes_to_gib(item.spec.weight_bytes):.2f} GiB ({planned.weights_source}"
            f"), KV budget {bytes_to_gib(item.spec.kv_bytes):.2f} GiB ({planned.max_model_len:,}"
            f" tokens x {planned.max_num_seqs} seqs, {planned.kv_dtype.name}), CUDA graphs "
            f"{bytes_to_gib(item.spec.graphs):.2f} GiB"
        )
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


def run_profile(args: argparse.Namespace) -> int:
    """``plan profile``: a GPU profile's instances, their vLLM flags, and whether they fit."""
    settings = _load_config(args.config)
    profiles = settings.gpu_profiles
    if profiles is None:
        raise PlanInputError(f"{settings.config_dir / PROFILES_FILE}: not found")
    name = args.name if args.name is not None else profiles.default
    profile = profiles.profiles.get(name)
    if profile is None:
        raise PlanInputError(f"unknown profile {name!r} (profiles: {', '.join(profiles.profiles)})")
    total = _profile_gpu_bytes(args, name, profile.gpu_total_gb)
    gpu_source = "--gpu-gib" if args.gpu_gib is not None else "the profile's gpu_total_gb"
    plan = plan_profile(settings, name, total_bytes=total)
    return _emit(args, _profile_json(plan, gpu_source), _profile_table(plan, gpu_source))

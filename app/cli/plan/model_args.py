"""The model a `plan` command sizes: `--model`, `--hf-config` or shape flags, the KV
dtype, the weights (given or derived from parameters), the sizing constants, and the
planner's inputs that `plan context` and `plan gpus` both read from these flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypedDict

from app.cli.common import JsonDict, UsageError
from app.cli.plan.render import gib3
from app.planner.catalog import catalog_model
from app.planner.kv import (
    AttentionShape,
    KvDtype,
    kv_bytes_per_token,
    parse_kv_dtype,
)
from app.planner.model_info import ModelInfo
from app.planner.sizing import (
    SizingConstants,
)
from app.planner.units import GIB, gib_to_bytes
from app.planner.weights import estimate_weight_bytes, params_from_billions, served_dtype
from app.settings.hf_config import read_hf_config


def add_shape_args(group: argparse._ArgumentGroup) -> None:
    """`--hf-config` and the attention shape's flags, which `shape_from_flags` reads (the
    `plan` commands and `add` take the same)."""
    group.add_argument("--hf-config", help="path to a Hugging Face config.json (or its folder)")
    group.add_argument("--layers", type=int, help="num_hidden_layers")
    group.add_argument("--kv-heads", type=int, help="num_key_value_heads")
    group.add_argument("--head-dim", type=int, help="head_dim")
    group.add_argument("--kv-lora-rank", type=int, help="MLA: kv_lora_rank")
    group.add_argument("--rope-head-dim", type=int, help="MLA: qk_rope_head_dim")


def shape_flags_given(args: argparse.Namespace) -> bool:
    flags = (args.layers, args.kv_heads, args.head_dim, args.kv_lora_rank, args.rope_head_dim)
    return any(value is not None for value in flags)


def shape_from_flags(args: argparse.Namespace) -> AttentionShape:
    if args.layers is None:
        raise UsageError("--layers is required with shape flags")
    if args.kv_lora_rank is not None or args.rope_head_dim is not None:
        if args.kv_lora_rank is None or args.rope_head_dim is None:
            raise UsageError("MLA needs both --kv-lora-rank and --rope-head-dim")
        return AttentionShape(
            layers=args.layers, kv_lora_rank=args.kv_lora_rank, rope_head_dim=args.rope_head_dim
        )
    missing = [
        flag
        for flag, value in (("--kv-heads", args.kv_heads), ("--head-dim", args.head_dim))
        if value is None
    ]
    if missing:
        raise UsageError(f"{' and '.join(missing)} required with --layers")
    return AttentionShape(layers=args.layers, kv_heads=args.kv_heads, head_dim=args.head_dim)


def resolve_model(args: argparse.Namespace, *, required: bool) -> ModelInfo | None:
    sources = [
        name
        for name, given in (
            ("--model", args.model is not None),
            ("--hf-config", args.hf_config is not None),
            ("shape flags", shape_flags_given(args)),
        )
        if given
    ]
    if len(sources) > 1:
        raise UsageError(f"give only one of {' / '.join(sources)}")
    if args.model is not None:
        return catalog_model(args.model)
    if args.hf_config is not None:
        return read_hf_config(Path(args.hf_config))
    if sources:
        return ModelInfo(name="custom", shape=shape_from_flags(args))
    if required:
        raise UsageError(
            "describe the model: --model NAME, --hf-config PATH, or "
            "--layers/--kv-heads/--head-dim (MLA: --layers/--kv-lora-rank/--rope-head-dim)"
        )
    return None


def kv_dtype(args: argparse.Namespace, model: ModelInfo) -> KvDtype:
    return parse_kv_dtype(args.kv_dtype, model_dtype=model.torch_dtype or "bf16")


def shape_json(model: ModelInfo) -> JsonDict:
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


def shape_text(model: ModelInfo) -> str:
    shape = model.shape
    if shape.is_mla:
        return (
            f"{shape.layers} layers, MLA latent {shape.kv_lora_rank} + rope {shape.rope_head_dim}"
        )
    return f"{shape.layers} layers x {shape.kv_heads} KV heads x head_dim {shape.head_dim}"


def constants(args: argparse.Namespace) -> SizingConstants:
    return SizingConstants(
        utilization=args.utilization,
        weight_expansion=args.weight_expansion,
        overhead_bytes=args.overhead_gib * GIB,
        overhead_weight_fraction=args.overhead_weight_fraction,
        alignment=args.alignment,
    )


def weights(args: argparse.Namespace, model: ModelInfo | None) -> tuple[int, str]:
    """Weight bytes and how they were obtained."""
    if args.weights_gib is not None:
        if args.params_b is not None:
            raise UsageError("give --weights-gib or --params-b, not both")
        return gib_to_bytes(args.weights_gib), "given"
    params = params_from_billions(args.params_b) if args.params_b is not None else None
    if params is None and (model is None or model.params is None):
        raise UsageError(
            "give --weights-gib, or --params-b (or a catalog --model) to derive the weights"
        )
    dtype = args.weight_dtype or served_dtype(model.torch_dtype if model else None)
    weight, count = derive_weights(params, dtype, model)
    return weight, f"{count / 1e9:g}B params as {dtype}"


def derive_weights(params: int | None, dtype: str, model: ModelInfo | None) -> tuple[int, int]:
    """Weight bytes and the parameter count used (``params`` wins over the model's)."""
    if model is not None:
        count = params if params is not None else model.params
        assert count is not None
        return model.weight_bytes(dtype, count), count
    assert params is not None
    return estimate_weight_bytes(params, dtype), params


class SizingInputs(TypedDict):
    """The keyword arguments `plan_max_context` and `plan_min_gpus` share."""

    gpu_bytes: float
    weight_bytes: float
    kv_bytes_per_token: int
    kv_shard_limit: int | None
    constants: SizingConstants


def sizing_inputs(args: argparse.Namespace) -> tuple[ModelInfo | None, SizingInputs, JsonDict]:
    """The model, the planner's inputs and the JSON facts shared by context/gpus (the KV
    dtype, the model, KV bytes per token, the weights and where they came from)."""
    model = resolve_model(args, required=args.bytes_per_token is None)
    facts: JsonDict = {}
    if args.bytes_per_token is not None:
        per_token = int(args.bytes_per_token)
        facts["kv_dtype"] = None
    else:
        assert model is not None
        dtype = kv_dtype(args, model)
        per_token = kv_bytes_per_token(model.shape, dtype)
        facts["kv_dtype"] = dtype.name
    shard_limit = model.shape.kv_shard_limit if model is not None else None
    if model is not None:
        facts["model"] = model.name
    facts["kv_bytes_per_token"] = per_token
    weight, weight_source = weights(args, model)
    facts.update(weights_gib=gib3(weight), weights_source=weight_source)
    inputs = SizingInputs(
        gpu_bytes=args.gpu_gib * GIB,
        weight_bytes=weight,
        kv_bytes_per_token=per_token,
        kv_shard_limit=shard_limit,
        constants=constants(args),
    )
    return model, inputs, facts

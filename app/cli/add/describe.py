"""What `microscheduler add` writes as the backend's `model_info:`: from the catalog, a
`config.json` (found on disk, or `--hf-config`) or the shape flags, with the weights from
the flags, the checkpoint's files or the catalog. Pure: the files were read by `source`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.cli.add.family import CATALOG_CONFIG
from app.cli.add.source import Found
from app.cli.common import UsageError
from app.cli.plan.model_args import shape_flags_given, shape_from_flags
from app.planner.catalog import catalog_model
from app.planner.kv import AttentionShape
from app.planner.model_info import ModelInfo, model_from_hf_config
from app.planner.units import GIB

SIZE_FLAGS = (
    "--layers N --kv-heads N --head-dim N (MLA: --layers N --kv-lora-rank N "
    "--rope-head-dim N) with --params-b B or --weights-gib G"
)


@dataclass(frozen=True)
class Description:
    """The `model_info:` mapping, the model it describes, and what its family is read from."""

    model_info: dict[str, object]
    model: ModelInfo
    config: Mapping[str, object]  # config.json (or what the catalog says of it): the family
    source: str  # for the printed summary
    notes: list[str] = field(default_factory=list)


def catalog_name(model: str) -> str | None:
    try:
        return catalog_model(model).name
    except ValueError:
        return None


def describe(args: argparse.Namespace, found: Found | None, *, where_looked: str) -> Description:
    """The model of `--model` (`found`: its config.json on disk, if any)."""
    if args.hf_config is not None and shape_flags_given(args):
        raise UsageError("give --hf-config or the shape flags, not both")
    if shape_flags_given(args):
        model = ModelInfo(name="shape flags", shape=shape_from_flags(args))
        return _with_weights(args, _shape_info(model.shape), model, None, {}, "the shape flags")
    if found is not None:
        model = model_from_hf_config(found.config, name=args.model)
        return _with_weights(
            args,
            _shape_info(model.shape),
            model,
            found,
            found.config,
            f"config.json at {found.config_path}",
        )
    short = catalog_name(args.model)
    if short is not None:
        model = catalog_model(short)
        info: dict[str, object] = {"catalog": short}
        if args.weights_gib is not None:
            info["weights_gib"] = args.weights_gib
        elif args.params_b is not None:
            info["params_b"] = args.params_b
        if args.weight_dtype is not None:
            info["weights_dtype"] = args.weight_dtype
        return Description(
            info, model, CATALOG_CONFIG.get(short, {}), f"the catalog's {short} (no config.json)"
        )
    raise UsageError(
        f"no config.json for {args.model!r}: not a local directory, not in the Hugging Face "
        f"cache ({where_looked}), not in the catalog, and nothing is downloaded. Download it "
        f"(`hf download {args.model} config.json`), pass its directory as --model or its "
        f"config.json as --hf-config, or give the sizes: {SIZE_FLAGS}"
    )


def _shape_info(shape: AttentionShape) -> dict[str, object]:
    if shape.is_mla:
        return {
            "layers": shape.layers,
            "kv_lora_rank": shape.kv_lora_rank,
            "rope_head_dim": shape.rope_head_dim,
        }
    return {"layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}


def _quant_method(config: Mapping[str, object]) -> str | None:
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    return method if method in ("awq", "gptq") else None


def _with_weights(
    args: argparse.Namespace,
    info: dict[str, object],
    model: ModelInfo,
    found: Found | None,
    config: Mapping[str, object],
    source: str,
) -> Description:
    """`info` with its weights: --weights-gib, --params-b, the checkpoint's files, or the
    catalog's parameter count for the same repository."""
    notes: list[str] = []
    short = catalog_name(args.model)
    if args.weights_gib is not None and args.params_b is not None:
        raise UsageError("give --weights-gib or --params-b, not both")
    if args.weights_gib is not None:
        info["weights_gib"] = args.weights_gib
    elif args.params_b is not None:
        info["params_b"] = args.params_b
    elif found is not None and found.weights_bytes is not None:
        info["weights_gib"] = math.ceil(found.weights_bytes / GIB * 100) / 100
        notes.append(f"weights: {found.weights_from}")
    elif short is not None and catalog_model(short).params is not None:
        params = catalog_model(short).params
        assert params is not None
        info["params_b"] = round(params / 1e9, 3)
        notes.append(f"weights: {info['params_b']}B parameters (the catalog's {short})")
    else:
        raise UsageError(
            f"{source} gives the shape but not the size of the weights (no safetensors "
            "files next to it, and the model is not in the catalog): give --params-b B "
            "(billions of parameters) or --weights-gib G (the checkpoint's size)"
        )
    dtype = args.weight_dtype or (_quant_method(config) if "params_b" in info else None)
    if dtype is not None:
        info["weights_dtype"] = dtype
    elif "params_b" in info and model.torch_dtype is not None:
        info["weights_dtype"] = model.torch_dtype
    return Description(info, model, config, source, notes)

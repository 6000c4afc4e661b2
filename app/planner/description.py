"""A backend's model description resolved for planning: `resolve(model_info, hf_config)`
turns what `models.yaml` says (`app.settings.model_info` has the keys and their meaning)
into a `PlannedModel`, checked: the model, its weights, KV dtype and serving flags.

Pure and cheap: `hf_config:` was read when the configuration was loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.planner.catalog import catalog_model
from app.planner.inputs import DescribedFile, ModelDescription
from app.planner.kv import (
    AttentionShape,
    KvDtype,
    kv_bytes_per_token,
    one_request_kv_bytes,
    parse_kv_dtype,
)
from app.planner.model_info import ModelInfo
from app.planner.share import DEFAULT_CUDA_CONTEXT_BYTES, DEFAULT_INSTANCE_OVERHEAD_BYTES
from app.planner.units import bytes_to_gib, gib_to_bytes
from app.planner.weights import params_from_billions, served_dtype

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_GRAPHS_GIB = 0.8
DEFAULT_OVERHEAD_GIB = bytes_to_gib(DEFAULT_INSTANCE_OVERHEAD_BYTES)
DEFAULT_CUDA_CONTEXT_GIB = bytes_to_gib(DEFAULT_CUDA_CONTEXT_BYTES)

SHAPE_KEYS = ("layers", "kv_heads", "head_dim", "kv_lora_rank", "rope_head_dim")


@dataclass(frozen=True)
class PlannedModel:
    """A backend's model and serving flags, resolved and checked: what the footprint needs."""

    model: ModelInfo
    source: str  # "catalog NAME", "hf_config PATH" or "model_info"
    repo: str | None  # what `vllm serve` loads; None: the backend's first model id
    weight_bytes: int  # the checkpoint, before vLLM's expansion
    weights_source: str
    kv_dtype: KvDtype
    kv_dtype_flag: str | None  # `--kv-cache-dtype` as written; None for auto
    kv_bytes_per_token: int
    max_model_len: int
    max_num_seqs: int | None  # `--max-num-seqs` as configured; None: vLLM's default
    cuda_graphs: bool
    graph_bytes: int
    graphs_in_budget: bool  # vLLM >= 0.21 takes the graphs from the budget (see share.py)
    overhead_bytes: int
    cuda_context_bytes: int
    gpu_memory_utilization: float | None

    @property
    def kv_budget_bytes(self) -> int:
        """The least KV cache vLLM starts with: one request of `max_model_len` tokens (whole
        model; `one_request_kv_bytes`). vLLM does not size the cache by `max_num_seqs`: it
        takes what the budget leaves and reports how many full-length requests that holds."""
        return one_request_kv_bytes(self.kv_bytes_per_token, self.max_model_len)


_DESCRIBE = (
    "describe the model with catalog: NAME, the shape (layers, kv_heads, head_dim; MLA: "
    "layers, kv_lora_rank, rope_head_dim), or hf_config: PATH next to model_info"
)


def _model(info: ModelDescription, hf: DescribedFile | None) -> tuple[ModelInfo, str]:
    if hf is not None:
        if info.catalog is not None or info.shape_given:
            what = "catalog" if info.catalog is not None else "the shape fields"
            raise ValueError(f"model_info: give {what} or hf_config, not both")
        return hf.model, f"hf_config {hf.path}"
    if info.catalog is not None:
        return catalog_model(info.catalog), f"catalog {info.catalog}"
    if not info.shape_given:
        raise ValueError(f"model_info: {_DESCRIBE}")
    if info.layers is None:
        raise ValueError("model_info.layers: is required with the shape fields")
    try:
        shape = AttentionShape(
            layers=info.layers,
            kv_heads=info.kv_heads,
            head_dim=info.head_dim,
            kv_lora_rank=info.kv_lora_rank,
            rope_head_dim=info.rope_head_dim,
        )
    except ValueError as exc:
        raise ValueError(f"model_info: {exc}") from None
    return ModelInfo(name="model_info", shape=shape), "model_info"


def _weights(info: ModelDescription, model: ModelInfo) -> tuple[int, str]:
    if info.weights_gib is not None:
        return gib_to_bytes(info.weights_gib), f"{info.weights_gib:g} GiB given"
    params = params_from_billions(info.params_b) if info.params_b is not None else model.params
    if params is None:
        raise ValueError(
            "model_info.params_b: is required to size the weights (a config.json or a shape "
            "has no parameter count); or give model_info.weights_gib"
        )
    dtype = info.weights_dtype or served_dtype(model.torch_dtype)
    return model.weight_bytes(dtype, params), f"{params / 1e9:g}B params as {dtype}"


def planned_context(requested: int | None, limit: int | None) -> int:
    """The context (`--max-model-len`) to plan: `requested`, else `DEFAULT_MAX_MODEL_LEN`
    within the model's own limit; `ValueError` for a request beyond that limit."""
    if requested is None:
        return DEFAULT_MAX_MODEL_LEN if limit is None else min(limit, DEFAULT_MAX_MODEL_LEN)
    if limit is not None and requested > limit:
        raise ValueError(
            f"{requested} is more than the model's limit of {limit} tokens "
            "(max_position_embeddings)"
        )
    return requested


def resolve(info: ModelDescription | None, hf: DescribedFile | None) -> PlannedModel | None:
    """Combine `model_info:` and `hf_config:`; None without either, `ValueError` if unusable.

    Errors start with the key they are about (`model_info.params_b: ...`). Pure and cheap:
    `hf_config` was read when the configuration was loaded.
    """
    if info is None:
        if hf is None:
            return None
        # The settings layer gives `hf_config:` alone every `model_info:` default.
        raise ValueError("model_info: is required next to hf_config")
    model, source = _model(info, hf)
    weight_bytes, weights_source = _weights(info, model)
    try:
        kv_dtype = parse_kv_dtype(info.kv_dtype, model_dtype=model.torch_dtype or "bf16")
        per_token = kv_bytes_per_token(model.shape, kv_dtype)
    except ValueError as exc:
        raise ValueError(f"model_info.kv_dtype: {exc}") from None
    try:
        context = planned_context(info.max_model_len, model.max_context)
    except ValueError as exc:
        raise ValueError(f"model_info.max_model_len: {exc}") from None
    repo = info.repo
    if repo is None and info.catalog is not None:
        repo = model.source or None
    return PlannedModel(
        model=model,
        source=source,
        repo=repo,
        weight_bytes=weight_bytes,
        weights_source=weights_source,
        kv_dtype=kv_dtype,
        kv_dtype_flag=None if info.kv_dtype.strip().lower() == "auto" else info.kv_dtype,
        kv_bytes_per_token=per_token,
        max_model_len=context,
        max_num_seqs=info.max_num_seqs,
        cuda_graphs=info.cuda_graphs,
        graph_bytes=gib_to_bytes(info.graphs_gib),
        graphs_in_budget=not info.graphs_outside_budget,
        overhead_bytes=gib_to_bytes(info.overhead_gib),
        cuda_context_bytes=gib_to_bytes(info.cuda_context_gib),
        gpu_memory_utilization=info.gpu_memory_utilization,
    )

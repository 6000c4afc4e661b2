"""KAITO-style sizing: the longest context that fits on N GPUs, and the fewest GPUs for a context.

Pure functions over bytes; no I/O. The method is KAITO's memory estimator
(``kaito-project/kaito`` ``pkg/workspace/estimator``, docs "Memory Estimator"), per GPU:

- ``usable = gpu_memory x utilization`` (default 0.84, what KAITO passes to vLLM as
  ``--gpu-memory-utilization``);
- ``weights_per_gpu = weights x 1.02 / N`` (vLLM's in-memory weights are ~2% larger than the
  safetensors);
- ``overhead = 2.3 GiB + overhead_weight_fraction x weights_per_gpu`` (CUDA context + NCCL
  ~0.6 GiB, activations and CUDA graphs ~1.7 GiB; the fraction defaults to 0 as in KAITO's docs,
  set it to 0.05 for KAITO #2139's newer rule);
- ``remaining = usable - weights_per_gpu - overhead``;
- ``tokens = floor(remaining / (bytes_per_token / shards))``, clamped to the model's limit and
  aligned down to 256. ``shards`` is N for a bare ``bytes_per_token`` (KAITO's rule); with a
  model shape it is ``min(N, kv_heads)`` for GQA/MHA (vLLM replicates KV heads beyond that) and
  1 for MLA (the latent is replicated on every rank).

The GPU count is the smallest N with ``weights_per_gpu + overhead + context x bytes_per_token /
shards <= usable``. Unlike KAITO's ``floor(W / M) + 1`` this does not ask for an extra GPU when
the weights divide exactly.

Tensor parallelism must divide the model's attention heads: vLLM refuses "Total number of
attention heads (H) must be divisible by tensor parallel size (N)"
(``ModelConfig.verify_with_parallel_config``, vllm/config/model.py:1557-1564). With the heads
known, the count is the smallest divisor of them at or above what memory needs (Llama-3.1-70B,
64 heads: 3 GPUs hold it on 80 GiB, tensor parallelism takes 4). Tensor parallelism stays
within a node: with ``gpus_per_node`` set and no tensor-parallel size up to it enough, the
layout is vLLM's multi-node one, tensor parallel within each node (the largest divisor of the
heads that fits in a node) x pipeline parallel across nodes (the fewest stages that fit; a
stage holds ``1 / stages`` of the layers: weights and KV cache split by tensor x pipeline,
the KV heads by at most their count). Without ``gpus_per_node`` one node holds every GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from app.planner.units import (
    GIB,
    bytes_to_gib,
    require_non_negative,
    require_positive,
    require_positive_int,
)

DEFAULT_UTILIZATION = 0.84
DEFAULT_WEIGHT_EXPANSION = 1.02
DEFAULT_OVERHEAD_BYTES = 2.3 * GIB
DEFAULT_ALIGNMENT = 256
DEFAULT_SIZING_CONTEXT = 2048
#: Upper bound of the GPU-count search: far beyond any single deployment.
DEFAULT_MAX_GPUS = 1024


@dataclass(frozen=True)
class SizingConstants:
    """KAITO's tunables; every one can be overridden."""

    utilization: float = DEFAULT_UTILIZATION
    weight_expansion: float = DEFAULT_WEIGHT_EXPANSION
    overhead_bytes: float = DEFAULT_OVERHEAD_BYTES
    overhead_weight_fraction: float = 0.0
    alignment: int = DEFAULT_ALIGNMENT

    def __post_init__(self) -> None:
        require_positive(self.utilization, "GPU memory utilization")
        if self.utilization > 1:
            raise ValueError(f"GPU memory utilization must be <= 1, got {self.utilization!r}")
        require_positive(self.weight_expansion, "weight expansion factor")
        require_non_negative(self.overhead_bytes, "overhead")
        require_non_negative(self.overhead_weight_fraction, "overhead weight fraction")
        require_positive_int(self.alignment, "alignment")


DEFAULT_CONSTANTS = SizingConstants()


@dataclass(frozen=True)
class PerGpuBudget:
    """Where one GPU's memory goes for a given GPU count (bytes)."""

    gpus: int  # tensor-parallel size (of each pipeline stage)
    usable_bytes: float
    weight_bytes: float
    overhead_bytes: float
    kv_shards: int
    kv_bytes_per_token: float
    pipeline: int = 1

    @property
    def remaining_bytes(self) -> float:
        """Memory left for the KV cache on each GPU (may be negative)."""
        return self.usable_bytes - self.weight_bytes - self.overhead_bytes


def per_gpu_budget(
    *,
    gpu_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: int,
    gpus: int,
    kv_shard_limit: int | None = None,
    constants: SizingConstants = DEFAULT_CONSTANTS,
    pipeline: int = 1,
) -> PerGpuBudget:
    """Split weights, overhead and KV over ``gpus`` GPUs (tensor parallel) of ``gpu_bytes``
    each, in each of ``pipeline`` stages (each stage holds ``1 / pipeline`` of the layers)."""
    require_positive(gpu_bytes, "GPU memory")
    require_positive(weight_bytes, "weights")
    require_positive_int(kv_bytes_per_token, "KV bytes per token")
    require_positive_int(gpus, "GPU count")
    require_positive_int(pipeline, "pipeline stages")
    if kv_shard_limit is not None:
        require_positive_int(kv_shard_limit, "KV shard limit")
    shards = gpus if kv_shard_limit is None else min(gpus, kv_shard_limit)
    weights = weight_bytes * constants.weight_expansion / (gpus * pipeline)
    return PerGpuBudget(
        gpus=gpus,
        usable_bytes=gpu_bytes * constants.utilization,
        weight_bytes=weights,
        overhead_bytes=constants.overhead_bytes + constants.overhead_weight_fraction * weights,
        kv_shards=shards,
        kv_bytes_per_token=kv_bytes_per_token / (shards * pipeline),
        pipeline=pipeline,
    )


@dataclass(frozen=True)
class ContextPlan:
    """Longest context (``--max-model-len``) that fits, and why."""

    max_context_tokens: int
    raw_tokens: int
    model_limit: int | None
    clamped: bool
    budget: PerGpuBudget
    reason: str


def plan_max_context(
    *,
    gpu_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: int,
    gpus: int = 1,
    model_limit: int | None = None,
    kv_shard_limit: int | None = None,
    constants: SizingConstants = DEFAULT_CONSTANTS,
) -> ContextPlan:
    """Longest context on ``gpus`` GPUs of ``gpu_bytes`` each (KAITO's method, see module doc).

    Returns 0 tokens with a reason when weights and overhead leave nothing for the KV cache,
    or when less than one alignment block fits.
    """
    if model_limit is not None:
        require_positive_int(model_limit, "model context limit")
    budget = per_gpu_budget(
        gpu_bytes=gpu_bytes,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        gpus=gpus,
        kv_shard_limit=kv_shard_limit,
        constants=constants,
    )
    remaining = budget.remaining_bytes
    if remaining <= 0:
        reason = (
            f"no memory left for the KV cache: usable {bytes_to_gib(budget.usable_bytes):.2f} GiB"
            f" - weights {bytes_to_gib(budget.weight_bytes):.2f} GiB"
            f" - overhead {bytes_to_gib(budget.overhead_bytes):.2f} GiB"
            f" = {bytes_to_gib(remaining):.2f} GiB per GPU"
        )
        return ContextPlan(0, 0, model_limit, False, budget, reason)
    raw = math.floor(remaining * budget.kv_shards / kv_bytes_per_token)
    clamped = model_limit is not None and raw > model_limit
    limited = model_limit if clamped and model_limit is not None else raw
    aligned = limited // constants.alignment * constants.alignment
    if aligned == 0:
        reason = (
            f"only {raw} tokens fit in {bytes_to_gib(remaining):.2f} GiB per GPU, "
            f"less than one {constants.alignment}-token block"
        )
    elif clamped:
        reason = f"clamped to the model's limit of {model_limit} tokens ({raw} would fit)"
    else:
        reason = (
            f"{bytes_to_gib(remaining):.2f} GiB per GPU / {budget.kv_bytes_per_token:g} bytes "
            f"per token = {raw} tokens, aligned down to {constants.alignment}"
        )
    return ContextPlan(aligned, raw, model_limit, clamped, budget, reason)


@dataclass(frozen=True)
class GpuCountPlan:
    """Fewest GPUs (and nodes) that hold the weights, overhead and KV for ``context_tokens``.

    ``min_gpus`` = ``tensor_parallel x pipeline_parallel``; ``memory_gpus`` is what memory
    alone needs with tensor parallelism on one node (None when nothing fits).
    """

    fits: bool
    min_gpus: int | None
    min_nodes: int | None
    gpus_per_node: int | None  # None: one node holds every GPU
    context_tokens: int
    needed_bytes_per_gpu: float | None
    usable_bytes_per_gpu: float
    reason: str
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    memory_gpus: int | None = None
    attention_heads: int | None = None


def _needed(budget: PerGpuBudget, context_tokens: int) -> float:
    return budget.weight_bytes + budget.overhead_bytes + context_tokens * budget.kv_bytes_per_token


def _divides(heads: int | None, tp: int) -> bool:
    return heads is None or heads % tp == 0


def plan_min_gpus(
    *,
    gpu_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: int,
    context_tokens: int = DEFAULT_SIZING_CONTEXT,
    gpus_per_node: int | None = None,
    kv_shard_limit: int | None = None,
    max_gpus: int = DEFAULT_MAX_GPUS,
    constants: SizingConstants = DEFAULT_CONSTANTS,
    attention_heads: int | None = None,
) -> GpuCountPlan:
    """Smallest valid layout up to ``max_gpus`` GPUs that fits; says why when none does.

    Tensor parallel sizes divide ``attention_heads`` when it is known (module docstring).
    """
    require_positive_int(context_tokens, "context tokens")
    if gpus_per_node is not None:
        require_positive_int(gpus_per_node, "GPUs per node")
    require_positive_int(max_gpus, "maximum GPU count")
    if attention_heads is not None:
        require_positive_int(attention_heads, "attention heads")
    usable = gpu_bytes * constants.utilization

    def budget(tp: int, pp: int = 1) -> PerGpuBudget:
        return per_gpu_budget(
            gpu_bytes=gpu_bytes,
            weight_bytes=weight_bytes,
            kv_bytes_per_token=kv_bytes_per_token,
            gpus=tp,
            kv_shard_limit=kv_shard_limit,
            constants=constants,
            pipeline=pp,
        )

    def fits(tp: int, pp: int = 1) -> bool:
        return _needed(budget(tp, pp), context_tokens) <= usable

    memory = next((n for n in range(1, max_gpus + 1) if fits(n)), None)
    node_limit = min(max_gpus, gpus_per_node or max_gpus)
    single = next(
        (
            n
            for n in range(memory or node_limit + 1, node_limit + 1)
            if _divides(attention_heads, n)
        ),
        None,
    )

    def result(
        layout: tuple[int, int] | None, nodes: int | None, needed: float | None, reason: str
    ) -> GpuCountPlan:
        return GpuCountPlan(
            fits=layout is not None,
            min_gpus=None if layout is None else layout[0] * layout[1],
            min_nodes=nodes,
            gpus_per_node=gpus_per_node,
            context_tokens=context_tokens,
            needed_bytes_per_gpu=needed,
            usable_bytes_per_gpu=usable,
            reason=reason,
            tensor_parallel=None if layout is None else layout[0],
            pipeline_parallel=None if layout is None else layout[1],
            memory_gpus=memory,
            attention_heads=attention_heads,
        )

    if single is not None:
        needed = _needed(budget(single), context_tokens)
        reason = _single_node_reason(single, memory, needed, usable, attention_heads)
        return result((single, 1), 1, needed, reason)
    if gpus_per_node is not None:
        layout = _multi_node(fits, gpus_per_node, max_gpus, attention_heads)
        if layout is not None:
            tp, pp = layout
            needed = _needed(budget(tp, pp), context_tokens)
            reason = (
                f"one node's {gpus_per_node} GPU(s) do not hold it with a tensor-parallel size"
                f"{_heads_note(attention_heads)}; tensor parallel {tp} within each node x "
                f"pipeline parallel {pp} across nodes = {tp * pp} GPUs need "
                f"{bytes_to_gib(needed):.2f} GiB each of the {bytes_to_gib(usable):.2f} GiB usable"
            )
            return result(layout, -(-pp // (gpus_per_node // tp)), needed, reason)
    if memory is not None:
        # Memory alone would do, but not with a tensor-parallel size vLLM accepts in a node.
        if memory > node_limit:
            why = (
                f"{memory} GPUs hold it with tensor parallelism, more than one node's "
                f"{gpus_per_node}, and no pipeline-parallel layout up to {max_gpus} GPUs fits"
            )
        else:
            why = (
                f"{memory} GPU(s) hold it, but no tensor-parallel size from {memory} to "
                f"{node_limit} divides the model's {attention_heads} attention heads"
            )
        if gpus_per_node is None:
            why += "; give --gpus-per-node to plan pipeline parallel across nodes"
        return result(None, None, None, why)
    why = _why_nothing_fits(
        gpu_bytes=gpu_bytes,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        context_tokens=context_tokens,
        kv_shard_limit=kv_shard_limit,
        max_gpus=max_gpus,
        constants=constants,
    )
    return result(None, None, None, why)


def _heads_note(heads: int | None) -> str:
    return "" if heads is None else f" that divides the {heads} attention heads"


def _single_node_reason(
    gpus: int, memory: int | None, needed: float, usable: float, heads: int | None
) -> str:
    fit = (
        f"{gpus} GPU(s) need {bytes_to_gib(needed):.2f} GiB each of the "
        f"{bytes_to_gib(usable):.2f} GiB usable"
    )
    if heads is None:
        return (
            f"{fit}; the attention heads are unknown, so the count is not checked against "
            "tensor-parallel divisibility (give --attention-heads)"
        )
    if memory is not None and memory < gpus:
        return (
            f"{memory} GPU(s) hold it; tensor parallelism needs a divisor of {heads} heads: "
            f"{gpus} ({fit})"
        )
    return f"{fit} (tensor parallel {gpus} divides the {heads} attention heads)"


def _multi_node(
    fits: Callable[[int, int], bool], per_node: int, max_gpus: int, heads: int | None
) -> tuple[int, int] | None:
    """Tensor parallel within a node (the largest valid size) x the fewest pipeline stages."""
    tp = next((n for n in range(min(per_node, max_gpus), 0, -1) if _divides(heads, n)), None)
    if tp is None:
        return None
    return next(((tp, pp) for pp in range(2, max_gpus // tp + 1) if fits(tp, pp)), None)


def _why_nothing_fits(
    *,
    gpu_bytes: float,
    weight_bytes: float,
    kv_bytes_per_token: int,
    context_tokens: int,
    kv_shard_limit: int | None,
    max_gpus: int,
    constants: SizingConstants,
) -> str:
    usable = gpu_bytes * constants.utilization
    shards = max_gpus if kv_shard_limit is None else min(max_gpus, kv_shard_limit)
    floor_need = constants.overhead_bytes + context_tokens * kv_bytes_per_token / shards
    if floor_need >= usable:
        kv_note = (
            f" (the KV cache cannot be split further: at most {kv_shard_limit} way(s))"
            if kv_shard_limit is not None and kv_shard_limit < max_gpus
            else ""
        )
        return (
            f"nothing fits at any GPU count: overhead plus the KV cache for {context_tokens} "
            f"tokens alone need {bytes_to_gib(floor_need):.2f} GiB per GPU{kv_note}, "
            f"but only {bytes_to_gib(usable):.2f} GiB is usable"
        )
    return (
        f"nothing up to {max_gpus} GPUs fits: weights "
        f"{bytes_to_gib(weight_bytes * constants.weight_expansion):.1f} GiB are too large "
        f"for GPUs with {bytes_to_gib(usable):.2f} GiB usable"
    )

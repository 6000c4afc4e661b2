"""The VRAM one instance of a backend will hold on each of its GPUs, and where that comes from.

Precedence, first that applies (`Footprint.source`):

1. `vram_mib` of the backend in `models.yaml` ("vram_mib");
2. the active GPU profile's share, `vram_pct` x the GPU (`Profile.planned_mib`; "profile");
3. the planner, from the backend's model description (`model_info:` / `hf_config:`, see
   `app/planner/description.py`; "planner").

Planner, per GPU, for a backend on N GPUs (tensor parallel N):

- weights = checkpoint x 1.02 / N (vLLM's in-memory expansion, `app/planner/sizing.py`);
- KV budget = vLLM's least KV cache, one request of `max_model_len` tokens in whole 16-token
  blocks plus the null block, at bytes per token / min(N, KV heads) (an MLA latent is not
  split): vLLM refuses to start below it (`check_enough_kv_cache_memory`,
  `vllm/v1/core/kv_cache_planning.py`) and never sizes the cache by `max_num_seqs`;
- the instance as `app/planner/share.py` models it: CUDA context + `U x T` (vLLM's budget for
  weights, runtime overhead, CUDA graphs and KV cache: vLLM >= 0.21 takes the graphs' profiled
  estimate from the budget, `determine_available_memory` in `vllm/v1/worker/gpu_worker.py`),
  with `U` the smallest `--gpu-memory-utilization` step that leaves the KV budget on an
  otherwise empty GPU of `T` MiB (or the pinned `gpu_memory_utilization`). With
  `model_info.graphs_outside_budget` (vLLM < 0.21, or `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
  =0`) the graphs come on top: CUDA context + `U x T` + CUDA graphs. Without `T`, or when it
  does not fit on `T` at all, the sum of the parts with exactly the KV budget.

How the gateway uses it (admission when `vram_mib` is absent; planned vs measured in /status)::

    profile = settings.gpu_profiles.profiles[active_name] if settings.gpu_profiles else None
    chosen = profile.models.get(name) if profile else None
    footprint = planned_footprint_mib(
        settings.backends[name],
        gpu_total_mib=reading.gpus[gpu].total_mib,  # None when no GPU is known
        profile_planned_mib=profile.planned_mib(name, total_mib) if profile else None,
        cuda_graphs=chosen.cuda_graphs if chosen else None,
    )
    need_mib = footprint.mib if footprint else None  # None: nothing to admit against

Pure: no I/O (`hf_config` was read once when the configuration was loaded); a call is a few
microseconds, so it may run on every admission.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from app.planner.description import PlannedModel, resolve
from app.planner.inputs import PlannedBackend
from app.planner.kv import one_request_kv_bytes
from app.planner.share import InstancePlan, InstanceSpec, ShareRequest, plan_share
from app.planner.sizing import DEFAULT_WEIGHT_EXPANSION
from app.planner.units import MIB

FootprintSource = Literal["vram_mib", "profile", "planner"]


def ceil_mib(n_bytes: float) -> int:
    """Whole MiB that hold `n_bytes` (admission compares whole MiB)."""
    return max(0, math.ceil(n_bytes / MIB - 1e-9))


@dataclass(frozen=True)
class PlannerParts:
    """Where the planner's footprint goes on one GPU (bytes) and the flags it assumes."""

    weights_bytes: int
    kv_cache_bytes: float  # what vLLM allocates: at least the KV budget
    kv_budget_bytes: int
    cuda_graphs_bytes: int
    graphs_in_budget: bool  # inside `U x T` (vLLM >= 0.21) or on top of it
    overhead_bytes: int  # activation peak + non-torch memory
    cuda_context_bytes: int
    gpu_memory_utilization: float | None  # None: no GPU total to plan against
    kv_cache_memory_bytes: int | None
    fits_gpu: bool | None  # runs alone on the GPU with its KV budget; None: GPU unknown
    problems: tuple[str, ...]
    #: vLLM's "Maximum concurrency for max_model_len tokens per request"; None: unknown.
    max_concurrency: float | None = None


@dataclass(frozen=True)
class Footprint:
    """MiB an instance holds per GPU and how that was decided."""

    mib: int
    source: FootprintSource
    parts: PlannerParts | None = None  # only for source "planner"


def instance_spec(
    planned: PlannedModel,
    *,
    gpus: int = 1,
    name: str = "instance",
    cuda_graphs: bool | None = None,
    gpu_memory_utilization: float | None = None,
) -> InstanceSpec:
    """One GPU's share of the instance, for `app/planner/share.py`.

    `cuda_graphs` and `gpu_memory_utilization` override the description's (a GPU profile's
    `cuda_graphs` and `vram_pct / 100`).
    """
    shards = min(gpus, planned.model.shape.kv_shard_limit)
    graphs = planned.cuda_graphs if cuda_graphs is None else cuda_graphs
    utilization = gpu_memory_utilization
    if utilization is None:
        utilization = planned.gpu_memory_utilization
    per_token = planned.kv_bytes_per_token / shards
    return InstanceSpec(
        name=name,
        weight_bytes=math.ceil(planned.weight_bytes * DEFAULT_WEIGHT_EXPANSION / gpus),
        kv_bytes=one_request_kv_bytes(per_token, planned.max_model_len),
        graph_bytes=planned.graph_bytes,
        overhead_bytes=planned.overhead_bytes,
        cuda_context_bytes=planned.cuda_context_bytes,
        enforce_eager=not graphs,
        gpu_memory_utilization=utilization,
        graphs_in_budget=planned.graphs_in_budget,
        max_model_len=planned.max_model_len,
        kv_bytes_per_token=per_token,
    )


def backend_instance(
    config: PlannedBackend, *, name: str = "instance", cuda_graphs: bool | None = None
) -> InstanceSpec | None:
    """The share-planner instance of a described backend; None without a description."""
    planned = resolve(config.model_info, config.hf_config)
    if planned is None:
        return None
    return instance_spec(planned, gpus=config.gpu_count, name=name, cuda_graphs=cuda_graphs)


def footprint_of(spec: InstanceSpec, plan: InstancePlan | None) -> Footprint:
    """The planner's footprint of `spec`, from its share plan (None: no GPU total known)."""
    if plan is None or not plan.runs:
        used: float = spec.footprint_bytes
        kv: float = spec.kv_bytes
    else:
        used, kv = plan.expected_used_bytes, plan.kv_bytes
    parts = PlannerParts(
        weights_bytes=spec.weight_bytes,
        kv_cache_bytes=kv,
        kv_budget_bytes=spec.kv_bytes,
        cuda_graphs_bytes=spec.graphs,
        graphs_in_budget=spec.graphs_in_budget,
        overhead_bytes=spec.overhead_bytes,
        cuda_context_bytes=spec.cuda_context_bytes,
        gpu_memory_utilization=None if plan is None else plan.gpu_memory_utilization,
        kv_cache_memory_bytes=None if plan is None else plan.kv_cache_memory_bytes,
        fits_gpu=None if plan is None else plan.ok,
        problems=() if plan is None else plan.problems,
        max_concurrency=spec.concurrency(kv),
    )
    return Footprint(ceil_mib(used), "planner", parts)


def planned_footprint_mib(
    config: PlannedBackend,
    *,
    gpu_total_mib: int | None,
    profile_planned_mib: int | None = None,
    cuda_graphs: bool | None = None,
) -> Footprint | None:
    """MiB one instance of `config` holds on each of its GPUs; None when nothing says.

    `gpu_total_mib`: the memory of the backend's GPU (a profile's `gpu_total_gb` or the
    probe's); `profile_planned_mib`: `Profile.planned_mib(name, gpu_total_mib)` of the active
    profile; `cuda_graphs`: the active profile's `cuda_graphs` for the backend, if any.
    """
    if config.vram_mib is not None:
        return Footprint(config.vram_mib, "vram_mib")
    if profile_planned_mib is not None:
        return Footprint(profile_planned_mib, "profile")
    spec = backend_instance(config, name="backend", cuda_graphs=cuda_graphs)
    if spec is None:
        return None
    return spec_footprint(spec, gpu_total_mib)


def spec_footprint(spec: InstanceSpec, gpu_total_mib: int | None) -> Footprint:
    """The planner's footprint of one GPU's share `spec`, alone on a GPU of
    `gpu_total_mib` (None: not known, the sum of its parts)."""
    if gpu_total_mib is None:
        return footprint_of(spec, None)
    alone = ShareRequest(total_bytes=gpu_total_mib * MIB, instances=(spec,))
    return footprint_of(spec, plan_share(alone).instances[0])

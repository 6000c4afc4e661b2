"""Model descriptions of backends: `model_info:` and `hf_config:` in `models.yaml`.

A backend that describes its model can be planned: with no `vram_mib`, the gateway takes its
admission footprint from the planner (`app/planner/footprint.py`), and `microscheduler plan
profile` checks a GPU profile and prints the vLLM command line of each instance.

```yaml
backends:
  reasoning:
    # ... url, models, runtime, lifecycle: lazy (no vram_mib needed with a description)
    hf_config: models/deepseek-r1-14b/config.json   # relative to the config directory
    model_info:
      params_b: 14.8          # config.json has no parameter count
      weights_dtype: awq
      kv_dtype: fp8
      max_model_len: 8192
      cuda_graphs: false      # --enforce-eager
  orchestrator:
    model_info: {catalog: qwen3-8b, weights_dtype: awq, max_model_len: 16384}
```

What the model is, one of:

- `catalog: NAME`: a built-in model (`microscheduler plan kv --model`; short name or Hugging
  Face id);
- the shape: `layers`, `kv_heads`, `head_dim` (MLA: `layers`, `kv_lora_rank`,
  `rope_head_dim`), as `plan kv` takes them;
- `hf_config: PATH` next to `model_info:`: a Hugging Face `config.json` (or its folder),
  relative to the config directory. It is read once, when the configuration is loaded.

Weights: `weights_gib` (the checkpoint's size), or `params_b` (billions; the catalog knows it)
x the bytes of `weights_dtype` (fp16, bf16, fp8, int8, int4, awq, gptq; default: the dtype
vLLM serves the checkpoint in). The planner adds vLLM's 2% (x 1.02) and splits weights and
KV cache over the backend's `gpus` (tensor parallel).

How it is served (the vLLM flags the footprint depends on), with the defaults:

- `max_model_len` (`--max-model-len`): 8192, or the model's own limit when that is smaller;
  more than the model's limit is refused, as vLLM does;
- `max_num_seqs` (`--max-num-seqs`): none, vLLM's default; a value is passed to vLLM as
  written. It does not size the KV cache: vLLM gives the cache what its
  `--gpu-memory-utilization` budget leaves and refuses to start only when that cannot hold
  one request of `max_model_len` tokens (`check_enough_kv_cache_memory`,
  `vllm/v1/core/kv_cache_planning.py`), so the planner needs that much and reports how many
  full-length requests the cache holds (vLLM's "Maximum concurrency" figure). vLLM does
  derive its CUDA-graph capture sizes from it (`max_num_seqs x 2`, at most 512:
  `vllm/config/vllm.py`), but the planner takes the graphs' memory as `graphs_gib`;
- `kv_dtype` (`--kv-cache-dtype`): `auto`, the model's dtype; any `plan kv` format (fp8,
  vLLM's `turboquant_4bit_nc`, ... sized with its full-precision boundary layers and slot
  layout, see `app/planner/kv.py`; the article's tq4, tq3k4v, ...), passed to vLLM as written;
- `cuda_graphs`: true, costing `graphs_gib` (0.8) inside vLLM's `--gpu-memory-utilization`
  budget: since vLLM 0.21 the graphs are profiled and their estimate is taken from the KV
  cache (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1` by default, `vllm/envs.py`;
  `determine_available_memory` in `vllm/v1/worker/gpu_worker.py`). False plans
  `--enforce-eager` (a GPU profile's `cuda_graphs` wins over it);
- `graphs_outside_budget`: false. True for a vLLM older than 0.21, or one started with
  `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0` (`plan profile` then prints that variable in
  the command's environment): the graphs come on top of the budget, so the planner adds them
  to the footprint instead of taking them from the KV cache;
- `overhead_gib` (activation peak and non-torch memory): 1.0; `cuda_context_gib`: 0.5 (see
  `app/planner/share.py`). CUDA context + overhead + graphs = 2.3 GiB, KAITO's base overhead;
- `gpu_memory_utilization`: none, the planner chooses it; a value pins it (a GPU profile's
  `vram_pct` wins over it);
- `repo`: what `vllm serve` loads in the printed command (default: the catalog model's
  Hugging Face id, else the backend's first model id).

Read the real weights, overhead and CUDA-graph memory from vLLM's start-up log ("Actual usage
is X GiB for consumed memory (weights + non-torch), Y GiB for peak activation, and G GiB for
CUDAGraph memory", `vllm/v1/worker/gpu_worker.py`; how to split it: `app/planner/share.py`)
and put them here for exact plans.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from app.planner.catalog import catalog_model
from app.planner.description import (
    DEFAULT_CUDA_CONTEXT_GIB,
    DEFAULT_GRAPHS_GIB,
    DEFAULT_OVERHEAD_GIB,
    SHAPE_KEYS,
)
from app.planner.kv import parse_kv_dtype
from app.planner.weights import normalize_weight_dtype
from app.settings.base import StrictConfig


class ModelInfoConfig(StrictConfig):
    """`model_info:` of a backend (see the module docstring for the keys and defaults)."""

    # What the model is.
    catalog: str | None = Field(
        None, description="A built-in model (short name or Hugging Face id), instead of the shape."
    )
    layers: PositiveInt | None = Field(None, description="Number of layers (the shape).")
    kv_heads: PositiveInt | None = Field(None, description="Key/value heads (the shape).")
    head_dim: PositiveInt | None = Field(None, description="Dimension of each head (the shape).")
    kv_lora_rank: PositiveInt | None = Field(
        None, description="MLA: the compressed KV rank (the shape)."
    )
    rope_head_dim: PositiveInt | None = Field(
        None, description="MLA: the rotary head dimension (the shape)."
    )
    params_b: PositiveFloat | None = Field(
        None, description="Parameters in billions (or weights_gib)."
    )
    weights_gib: PositiveFloat | None = Field(
        None, description="The checkpoint's size in GiB (or params_b)."
    )
    weights_dtype: str | None = Field(
        None,
        description="fp16, bf16, fp8, int8, int4, awq or gptq; null: the dtype vLLM serves it in.",
    )
    repo: str | None = Field(
        None,
        description=(
            "What `vllm serve` loads in the printed command; null: the catalog id, else models[0]."
        ),
    )
    # How it is served.
    max_model_len: PositiveInt | None = Field(
        None, description="--max-model-len; null: 8192, or the model's own limit when smaller."
    )
    max_num_seqs: PositiveInt | None = Field(
        None,
        description=(
            "--max-num-seqs (most requests running at once), passed to vLLM as written; "
            "null: vLLM's default. It does not size the KV cache."
        ),
    )
    kv_dtype: str = Field(
        "auto", description="--kv-cache-dtype: auto (the model's dtype), fp8, ..."
    )
    cuda_graphs: bool = Field(True, description="CUDA graphs (false plans --enforce-eager).")
    graphs_gib: NonNegativeFloat = Field(
        DEFAULT_GRAPHS_GIB, description="Memory of the CUDA graphs in GiB."
    )
    graphs_outside_budget: bool = Field(
        False, description="The graphs come on top of --gpu-memory-utilization (vLLM before 0.21)."
    )
    overhead_gib: NonNegativeFloat = Field(
        DEFAULT_OVERHEAD_GIB, description="Activation peak and non-torch memory in GiB."
    )
    cuda_context_gib: NonNegativeFloat = Field(
        DEFAULT_CUDA_CONTEXT_GIB, description="The CUDA context in GiB."
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="Pins --gpu-memory-utilization; null: the planner chooses it."
    )

    @field_validator("catalog")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        return None if value is None else catalog_model(value).name

    @field_validator("weights_dtype")
    @classmethod
    def _weights_dtype(cls, value: str | None) -> str | None:
        return None if value is None else normalize_weight_dtype(value)

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        parse_kv_dtype(value, model_dtype="bf16")  # the name only; `auto` resolves later
        return value

    @model_validator(mode="after")
    def _one_description(self) -> ModelInfoConfig:
        if self.catalog is not None and self.shape_given:
            raise ValueError(
                "give catalog or the shape fields (layers, kv_heads, head_dim, ...), not both"
            )
        if self.params_b is not None and self.weights_gib is not None:
            raise ValueError("give params_b or weights_gib, not both")
        return self

    @property
    def shape_given(self) -> bool:
        return any(getattr(self, key) is not None for key in SHAPE_KEYS)

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
      max_num_seqs: 4
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
- `max_num_seqs` (`--max-num-seqs`): 4. The KV budget is `max_model_len x max_num_seqs`
  tokens: that many full-length sequences at once;
- `kv_dtype` (`--kv-cache-dtype`): `auto`, the model's dtype; any `plan kv` format (fp8,
  tq4, tq3k4v, ...), passed to vLLM as written;
- `cuda_graphs`: true, costing `graphs_gib` (0.8) outside vLLM's budget; false plans
  `--enforce-eager` (a GPU profile's `cuda_graphs` wins over it);
- `overhead_gib` (activation peak and non-torch memory): 1.0; `cuda_context_gib`: 0.5 (see
  `app/planner/share.py`). CUDA context + overhead + graphs = 2.3 GiB, KAITO's base overhead;
- `gpu_memory_utilization`: none, the planner chooses it; a value pins it (a GPU profile's
  `vram_pct` wins over it);
- `repo`: what `vllm serve` loads in the printed command (default: the catalog model's
  Hugging Face id, else the backend's first model id).

Read the real weights, overhead and CUDA-graph memory from vLLM's start-up log ("Actual usage
is X GiB for weight, ...") and put them here for exact plans.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from app.planner.catalog import catalog_model
from app.planner.kv import AttentionShape, KvDtype, kv_bytes_per_token, parse_kv_dtype
from app.planner.model_info import ModelInfo, model_from_hf_config
from app.planner.share import DEFAULT_CUDA_CONTEXT_BYTES, DEFAULT_INSTANCE_OVERHEAD_BYTES
from app.planner.units import bytes_to_gib, gib_to_bytes
from app.planner.weights import normalize_weight_dtype, params_from_billions, served_dtype

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_NUM_SEQS = 4
DEFAULT_GRAPHS_GIB = 0.8
DEFAULT_OVERHEAD_GIB = bytes_to_gib(DEFAULT_INSTANCE_OVERHEAD_BYTES)
DEFAULT_CUDA_CONTEXT_GIB = bytes_to_gib(DEFAULT_CUDA_CONTEXT_BYTES)

_SHAPE_KEYS = ("layers", "kv_heads", "head_dim", "kv_lora_rank", "rope_head_dim")

# The config directory `hf_config:` paths are relative to, while `load_settings` validates.
_CONFIG_DIR: ContextVar[Path | None] = ContextVar("microscheduler_config_dir", default=None)


@contextlib.contextmanager
def paths_relative_to(directory: Path) -> Iterator[None]:
    """Resolve `hf_config:` paths validated inside the block against `directory`.

    Outside it (a `BackendConfig` built in code), relative paths are taken as given.
    """
    token = _CONFIG_DIR.set(directory)
    try:
        yield
    finally:
        _CONFIG_DIR.reset(token)


# --------------------------------------------------------------------------- hf_config


def config_json(path: Path) -> Path:
    """`path`, or the `config.json` in it when it is a folder."""
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: Path) -> ModelInfo:
    """Read a Hugging Face `config.json` (or the folder holding one); `ValueError` if unusable."""
    path = config_json(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"file not found: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must contain a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_hf_config(data, name=name or "hf-config")


@dataclass(frozen=True)
class HfConfigFile:
    """A backend's `hf_config:` once read: where it was and what it says."""

    path: Path
    model: ModelInfo


def _load_hf_config(value: Any) -> Any:
    if value is None or isinstance(value, HfConfigFile | Mapping):
        return value  # already read (a Mapping: a dumped `HfConfigFile` validated again)
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("must be the path of a Hugging Face config.json (or its folder)")
    path = Path(value).expanduser()
    base = _CONFIG_DIR.get()
    if base is not None and not path.is_absolute():
        path = base / path
    path = config_json(path)
    return HfConfigFile(path=path, model=read_hf_config(path))


HfConfigField = Annotated[HfConfigFile | None, BeforeValidator(_load_hf_config)]


# --------------------------------------------------------------------------- model_info


class ModelInfoConfig(BaseModel):
    """`model_info:` of a backend (see the module docstring for the keys and defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # What the model is.
    catalog: str | None = None
    layers: PositiveInt | None = None
    kv_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = None
    rope_head_dim: PositiveInt | None = None
    params_b: PositiveFloat | None = None
    weights_gib: PositiveFloat | None = None
    weights_dtype: str | None = None
    repo: str | None = None
    # How it is served.
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt = DEFAULT_MAX_NUM_SEQS
    kv_dtype: str = "auto"
    cuda_graphs: bool = True
    graphs_gib: NonNegativeFloat = DEFAULT_GRAPHS_GIB
    overhead_gib: NonNegativeFloat = DEFAULT_OVERHEAD_GIB
    cuda_context_gib: NonNegativeFloat = DEFAULT_CUDA_CONTEXT_GIB
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None

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
        return any(getattr(self, key) is not None for key in _SHAPE_KEYS)


# --------------------------------------------------------------------------- resolved


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
    max_num_seqs: int
    cuda_graphs: bool
    graph_bytes: int
    overhead_bytes: int
    cuda_context_bytes: int
    gpu_memory_utilization: float | None

    @property
    def kv_budget_bytes(self) -> int:
        """KV cache for `max_num_seqs` sequences of `max_model_len` tokens (whole model)."""
        return self.kv_bytes_per_token * self.max_model_len * self.max_num_seqs


_DESCRIBE = (
    "describe the model with catalog: NAME, the shape (layers, kv_heads, head_dim; MLA: "
    "layers, kv_lora_rank, rope_head_dim), or hf_config: PATH next to model_info"
)


def _model(info: ModelInfoConfig, hf: HfConfigFile | None) -> tuple[ModelInfo, str]:
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


def _weights(info: ModelInfoConfig, model: ModelInfo) -> tuple[int, str]:
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


def resolve(info: ModelInfoConfig | None, hf: HfConfigFile | None) -> PlannedModel | None:
    """Combine `model_info:` and `hf_config:`; None without either, `ValueError` if unusable.

    Errors start with the key they are about (`model_info.params_b: ...`). Pure and cheap:
    `hf_config` was read when the configuration was loaded.
    """
    if info is None and hf is None:
        return None
    info = info if info is not None else ModelInfoConfig()
    model, source = _model(info, hf)
    weight_bytes, weights_source = _weights(info, model)
    try:
        kv_dtype = parse_kv_dtype(info.kv_dtype, model_dtype=model.torch_dtype or "bf16")
        per_token = kv_bytes_per_token(model.shape, kv_dtype)
    except ValueError as exc:
        raise ValueError(f"model_info.kv_dtype: {exc}") from None
    limit = model.max_context
    context = info.max_model_len
    if context is None:
        context = DEFAULT_MAX_MODEL_LEN if limit is None else min(limit, DEFAULT_MAX_MODEL_LEN)
    elif limit is not None and context > limit:
        raise ValueError(
            f"model_info.max_model_len: {context} is more than the model's limit of {limit} "
            "tokens (max_position_embeddings)"
        )
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
        overhead_bytes=gib_to_bytes(info.overhead_gib),
        cuda_context_bytes=gib_to_bytes(info.cuda_context_gib),
        gpu_memory_utilization=info.gpu_memory_utilization,
    )

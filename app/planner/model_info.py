"""A model's memory-relevant description, built from a Hugging Face ``config.json`` dict.

Fields read (from ``text_config`` first when the file nests the language model there, as
multimodal checkpoints such as Gemma 3 do, then from the top level):

- ``num_hidden_layers`` (required);
- MLA: ``kv_lora_rank`` and ``qk_rope_head_dim`` (when ``kv_lora_rank`` is set and not null);
- otherwise ``num_key_value_heads``, falling back to ``num_attention_heads`` (MHA checkpoints
  omit it), and ``head_dim``, falling back to ``hidden_size / num_attention_heads`` (which
  must divide evenly). Qwen3 is why the explicit ``head_dim`` wins: Qwen3-30B-A3B has
  ``hidden_size`` 2048 and 32 heads (2048 / 32 = 64) but ``head_dim`` 128;
- ``max_position_embeddings`` (optional: the context limit);
- ``num_attention_heads`` (optional: tensor parallelism must divide it, vLLM's
  ``ModelConfig.verify_with_parallel_config`` in ``vllm/config/model.py``);
- ``torch_dtype`` or its newer name ``dtype`` (optional);
- ``vocab_size``, ``hidden_size`` and ``tie_word_embeddings`` (optional: the parameters of the
  embedding and LM head, which quantised checkpoints keep in 16 bits). A missing
  ``tie_word_embeddings`` is taken as "not tied" (the larger, safer estimate).

The parameter count is not in ``config.json``; it comes from the catalog or ``--params-b``.
Layer types are not modelled: sliding-window layers (Gemma, Mistral's old window) are counted
as full-attention layers, an upper bound on what vLLM's hybrid allocator needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.planner.kv import AttentionShape
from app.planner.units import require_positive_int
from app.planner.weights import estimate_weight_bytes, normalize_weight_dtype


@dataclass(frozen=True)
class ModelInfo:
    """What the planners need to know about one model."""

    name: str
    shape: AttentionShape
    max_context: int | None = None
    torch_dtype: str | None = None
    params: int | None = None
    embedding_params: int = 0
    source: str = ""
    attention_heads: int | None = None  # num_attention_heads (query heads); None: unknown

    def __post_init__(self) -> None:
        if self.attention_heads is not None:
            require_positive_int(self.attention_heads, "num_attention_heads")
        if self.max_context is not None:
            require_positive_int(self.max_context, "max_position_embeddings")
        if self.params is not None:
            require_positive_int(self.params, "parameter count")
        if self.torch_dtype is not None:
            normalize_weight_dtype(self.torch_dtype)

    def weight_bytes(self, dtype: str, params: int | None = None) -> int:
        """Estimated weight memory in ``dtype`` (see :mod:`app.planner.weights`)."""
        count = params if params is not None else self.params
        if count is None:
            raise ValueError(f"model {self.name!r} has no parameter count; pass --params-b")
        return estimate_weight_bytes(
            count, dtype, unquantized_params=min(self.embedding_params, count)
        )


class _Lookup:
    """Reads keys from ``text_config`` first, then from the top level of a config dict."""

    def __init__(self, config: Mapping[str, object]) -> None:
        text = config.get("text_config")
        self.scopes: list[Mapping[str, object]] = []
        if isinstance(text, Mapping):
            self.scopes.append(text)
        self.scopes.append(config)

    def raw(self, key: str) -> object | None:
        for scope in self.scopes:
            value = scope.get(key)
            if value is not None:
                return value
        return None

    def int_or_none(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
        return value

    def required_int(self, key: str, why: str = "") -> int:
        value = self.int_or_none(key)
        if value is None:
            where = " (looked in text_config too)" if len(self.scopes) > 1 else ""
            raise ValueError(f"config.json has no {key}{where}{why}")
        return value


def _shape_from_config(look: _Lookup) -> AttentionShape:
    layers = look.required_int("num_hidden_layers")
    kv_lora_rank = look.int_or_none("kv_lora_rank")
    if kv_lora_rank is not None:
        rope = look.required_int("qk_rope_head_dim", ", which MLA (kv_lora_rank) needs")
        return AttentionShape(layers=layers, kv_lora_rank=kv_lora_rank, rope_head_dim=rope)
    heads = look.int_or_none("num_attention_heads")
    kv_heads = look.int_or_none("num_key_value_heads") or heads
    if kv_heads is None:
        raise ValueError("config.json has neither num_key_value_heads nor num_attention_heads")
    head_dim = look.int_or_none("head_dim")
    if head_dim is None:
        hidden = look.required_int("hidden_size", " and no head_dim")
        if heads is None:
            raise ValueError("config.json has no head_dim and no num_attention_heads")
        if hidden % heads:
            raise ValueError(
                f"config.json: hidden_size {hidden} is not divisible by "
                f"num_attention_heads {heads}; give head_dim"
            )
        head_dim = hidden // heads
    return AttentionShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def _dtype_from_config(look: _Lookup) -> str | None:
    value = look.raw("torch_dtype") or look.raw("dtype")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"config.json: torch_dtype must be a string, got {value!r}")
    return normalize_weight_dtype(value.removeprefix("torch."))


def _embedding_params(look: _Lookup) -> int:
    vocab = look.int_or_none("vocab_size")
    hidden = look.int_or_none("hidden_size")
    if vocab is None or hidden is None:
        return 0
    tied = look.raw("tie_word_embeddings") is True
    return vocab * hidden * (1 if tied else 2)


def model_from_hf_config(
    config: Mapping[str, object], *, name: str = "hf-config", params: int | None = None
) -> ModelInfo:
    """Build a :class:`ModelInfo` from a parsed ``config.json``; ``ValueError`` if unusable."""
    if not isinstance(config, Mapping):
        raise ValueError("config.json must contain a JSON object")
    look = _Lookup(config)
    return ModelInfo(
        name=name,
        shape=_shape_from_config(look),
        max_context=look.int_or_none("max_position_embeddings"),
        torch_dtype=_dtype_from_config(look),
        params=params,
        embedding_params=_embedding_params(look),
        source="config.json",
        attention_heads=look.int_or_none("num_attention_heads"),
    )

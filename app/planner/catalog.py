"""A small built-in catalog of popular open models, from their published ``config.json``.

Shapes, context limits and dtypes are the values of each Hugging Face repository's
``config.json`` (the repository is named in ``source``); they were cross-checked against copies
of those files found in public code (``text_config`` for Gemma 3, ``head_dim`` 128 with
``hidden_size`` 2048 for Qwen3-30B-A3B, ``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64 for the
DeepSeek MLA models). Parameter counts are the totals published on the model cards, rounded as
published; MoE counts are all experts (they all sit in VRAM). The embedding/LM-head parameter
count is ``vocab_size x hidden_size``, doubled when the embeddings are not tied.

Lookup is case-insensitive and accepts the short name or the Hugging Face repository id.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from app.planner.kv import AttentionShape
from app.planner.model_info import ModelInfo


def _gqa(
    name: str,
    source: str,
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    max_context: int,
    params_b: float,
    vocab: int,
    hidden: int,
    tied: bool,
    dtype: str = "bf16",
) -> ModelInfo:
    return ModelInfo(
        name=name,
        shape=AttentionShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim),
        max_context=max_context,
        torch_dtype=dtype,
        params=round(params_b * 1e9),
        embedding_params=vocab * hidden * (1 if tied else 2),
        source=source,
        attention_heads=heads,
    )


def _mla(
    name: str,
    source: str,
    *,
    layers: int,
    heads: int,
    kv_lora_rank: int,
    rope_head_dim: int,
    max_context: int,
    params_b: float,
    vocab: int,
    hidden: int,
) -> ModelInfo:
    return ModelInfo(
        name=name,
        shape=AttentionShape(layers=layers, kv_lora_rank=kv_lora_rank, rope_head_dim=rope_head_dim),
        max_context=max_context,
        torch_dtype="bf16",
        params=round(params_b * 1e9),
        embedding_params=vocab * hidden * 2,
        source=source,
        attention_heads=heads,
    )


_MODELS = (
    # hidden 4096, 32 heads, 8 KV heads; config.json head_dim 128.
    _gqa(
        "llama-3.1-8b",
        "meta-llama/Llama-3.1-8B-Instruct",
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        max_context=131072,
        params_b=8.03,
        vocab=128256,
        hidden=4096,
        tied=False,
    ),
    # hidden 8192, 64 heads, 8 KV heads.
    _gqa(
        "llama-3.1-70b",
        "meta-llama/Llama-3.1-70B-Instruct",
        layers=80,
        heads=64,
        kv_heads=8,
        head_dim=128,
        max_context=131072,
        params_b=70.6,
        vocab=128256,
        hidden=8192,
        tied=False,
    ),
    # hidden 4096, 32 heads, 8 KV heads, explicit head_dim 128; 40960 native (YaRN beyond).
    _gqa(
        "qwen3-8b",
        "Qwen/Qwen3-8B",
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        max_context=40960,
        params_b=8.2,
        vocab=151936,
        hidden=4096,
        tied=False,
    ),
    # MoE, 128 experts; hidden 2048 and 32 heads but head_dim 128 (not 2048 / 32 = 64).
    _gqa(
        "qwen3-30b-a3b",
        "Qwen/Qwen3-30B-A3B",
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        max_context=40960,
        params_b=30.5,
        vocab=151936,
        hidden=2048,
        tied=False,
    ),
    # hidden 5120, 64 heads, 8 KV heads, head_dim 128.
    _gqa(
        "qwen3-32b",
        "Qwen/Qwen3-32B",
        layers=64,
        heads=64,
        kv_heads=8,
        head_dim=128,
        max_context=40960,
        params_b=32.8,
        vocab=151936,
        hidden=5120,
        tied=False,
    ),
    # Qwen2.5-14B architecture: hidden 5120, 40 heads (no head_dim: 5120 / 40 = 128), 8 KV heads.
    _gqa(
        "deepseek-r1-distill-qwen-14b",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        layers=48,
        heads=40,
        kv_heads=8,
        head_dim=128,
        max_context=131072,
        params_b=14.8,
        vocab=152064,
        hidden=5120,
        tied=False,
    ),
    # hidden 4096, 32 heads, 8 KV heads; v0.3 vocabulary 32768, no sliding window.
    _gqa(
        "mistral-7b-v0.3",
        "mistralai/Mistral-7B-Instruct-v0.3",
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        max_context=32768,
        params_b=7.25,
        vocab=32768,
        hidden=4096,
        tied=False,
    ),
    # hidden 3072, 24 heads (no head_dim: 3072 / 24 = 128), 8 KV heads, tied embeddings.
    # KAITO's preset generator gives the same 131072 bytes per token.
    _gqa(
        "phi-4-mini",
        "microsoft/Phi-4-mini-instruct",
        layers=32,
        heads=24,
        kv_heads=8,
        head_dim=128,
        max_context=131072,
        params_b=3.84,
        vocab=200064,
        hidden=3072,
        tied=True,
    ),
    # Multimodal: the language model sits under text_config (hidden 3840, 16 heads, 8 KV heads,
    # head_dim 256). 5 of every 6 layers use a 1024-token sliding window; counted as full here.
    _gqa(
        "gemma-3-12b",
        "google/gemma-3-12b-it",
        layers=48,
        heads=16,
        kv_heads=8,
        head_dim=256,
        max_context=131072,
        params_b=12.2,
        vocab=262208,
        hidden=3840,
        tied=True,
    ),
    # MLA; the released checkpoint stores weights in fp8 (pass --weight-dtype fp8).
    _mla(
        "deepseek-v3",
        "deepseek-ai/DeepSeek-V3",
        layers=61,
        heads=128,
        kv_lora_rank=512,
        rope_head_dim=64,
        max_context=163840,
        params_b=671,
        vocab=129280,
        hidden=7168,
    ),
    # MLA, small MoE.
    _mla(
        "deepseek-v2-lite",
        "deepseek-ai/DeepSeek-V2-Lite-Chat",
        layers=27,
        heads=16,
        kv_lora_rank=512,
        rope_head_dim=64,
        max_context=163840,
        params_b=15.7,
        vocab=102400,
        hidden=2048,
    ),
)

CATALOG: Mapping[str, ModelInfo] = MappingProxyType({m.name: m for m in _MODELS})

_EXTRA_ALIASES = {
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b",
    "deepseek-ai/deepseek-v2-lite": "deepseek-v2-lite",
    "mistralai/mistral-7b-v0.3": "mistral-7b-v0.3",
    "google/gemma-3-12b-pt": "gemma-3-12b",
    "qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
    "qwen/qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
}

_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{m.name: m.name for m in _MODELS},
        **{m.source.lower(): m.name for m in _MODELS},
        **_EXTRA_ALIASES,
    }
)


def catalog_names() -> tuple[str, ...]:
    """Short names of every catalog model, sorted."""
    return tuple(sorted(CATALOG))


def catalog_model(name: str) -> ModelInfo:
    """Look a model up by short name or Hugging Face id; ``ValueError`` lists the known ones."""
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(catalog_names())}")
    return CATALOG[key]

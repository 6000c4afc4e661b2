"""KV-cache size per token for the attention layouts and cache formats vLLM serves.

Standard attention (MHA / GQA / MQA) caches one key and one value vector of ``head_dim``
elements per KV head, per layer, per token::

    bytes_per_token = layers x kv_heads x (key_vector_bytes + value_vector_bytes)
                    = 2 x layers x kv_heads x head_dim x bytes_per_element   (plain formats)

MLA (DeepSeek-V2/V3 style) caches one compressed latent of ``kv_lora_rank`` elements plus the
decoupled RoPE key of ``qk_rope_head_dim`` elements per layer, shared by all heads, so there is
no factor 2 and no head count::

    bytes_per_token = layers x (kv_lora_rank + qk_rope_head_dim) x bytes_per_element

Cache formats (``--kv-cache-dtype``):

- plain element formats: ``fp32`` (4 bytes), ``fp16`` / ``bf16`` (2), ``fp8`` (1; the
  per-tensor scale is negligible);
- packed vector-quantised formats ``tqN`` (keys and values at N bits per element) and
  ``tqKkVv`` (keys at K bits, values at V bits, e.g. ``tq3k4v``), N, K, V in 1..8. Each vector
  is packed on its own and carries a 4-byte norm. **Rounding rule:** the packed bits of one
  vector are rounded *up* to whole bytes (a vector never shares a byte with the next one), then
  the 4-byte norm is added: ``ceil(bits x dim / 8) + 4``. So ``tq4`` stores a 128-dim vector in
  64 + 4 = 68 bytes (256 / 68 = 3.76x smaller than fp16) and ``tq3`` in 48 + 4 = 52 bytes; a
  70-dim ``tq3`` vector needs ceil(210 / 8) + 4 = 27 + 4 = 31 bytes. For MLA a ``tqN`` format
  packs the whole latent+RoPE vector as one vector; split key/value formats make no sense there.

Aliases accepted: ``float16``/``half``, ``bfloat16``, ``float32``/``float``, ``fp8_e4m3``/
``fp8_e5m2``, the article's ``tq-t4nc``/``tq-k3v4nc`` and vLLM's ``turboquant_*`` names (sized by
the packing rule above, which may differ slightly from a given kernel's page padding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.planner.units import FLOAT_ALIASES, require_positive_int

#: Bytes of the per-vector norm stored next to every packed ``tq`` vector.
TQ_NORM_BYTES = 4

_PLAIN_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8}

_ALIASES = {
    **FLOAT_ALIASES,
    # The TurboQuant article's flag values and vLLM's turboquant cache dtypes.
    "tq-t4nc": "tq4",
    "tq-k3v4nc": "tq3k4v",
    "turboquant_4bit_nc": "tq4",
    "turboquant_3bit_nc": "tq3",
    "turboquant_k3v4_nc": "tq3k4v",
    "turboquant_k8v4": "tq8k4v",
}

_TQ_SYMMETRIC = re.compile(r"tq(\d+)")
_TQ_SPLIT = re.compile(r"tq(\d+)k(\d+)v")

KNOWN_KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "tqN", "tqKkVv", "auto")


@dataclass(frozen=True)
class KvDtype:
    """One KV-cache storage format: bits per key / value element and per-vector norm bytes."""

    name: str
    key_bits: int
    value_bits: int
    norm_bytes: int = 0

    @property
    def packed(self) -> bool:
        """True for vector-quantised formats that store a norm next to every vector."""
        return self.norm_bytes > 0


def vector_bytes(bits: int, dim: int, norm_bytes: int = 0) -> int:
    """Bytes of one cached vector: ``ceil(bits x dim / 8) + norm_bytes``."""
    return -(-bits * dim // 8) + norm_bytes


def _tq_bits(text: str, raw: str) -> int:
    bits = int(text)
    if not 1 <= bits <= 8:
        raise ValueError(f"KV dtype {raw!r}: packed formats take 1 to 8 bits per element")
    return bits


def parse_kv_dtype(name: str, *, model_dtype: str | None = None) -> KvDtype:
    """Parse a ``--kv-cache-dtype`` value.

    ``auto`` means the model's own dtype, as vLLM does: ``bf16`` stays ``bf16``, ``fp16`` and
    ``fp32`` checkpoints are served (and cached) in ``fp16``. It needs ``model_dtype``.
    """
    raw = name
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key == "auto":
        if model_dtype is None:
            raise ValueError("KV dtype 'auto' needs the model's torch_dtype; pass --kv-dtype")
        resolved = parse_kv_dtype(model_dtype)
        if resolved.packed or resolved.name == "fp8":
            raise ValueError(f"model dtype {model_dtype!r} is not a 16/32-bit float dtype")
        return parse_kv_dtype("bf16" if resolved.name == "bf16" else "fp16")
    if key in _PLAIN_BITS:
        bits = _PLAIN_BITS[key]
        return KvDtype(key, bits, bits)
    if match := _TQ_SYMMETRIC.fullmatch(key):
        bits = _tq_bits(match.group(1), raw)
        return KvDtype(f"tq{bits}", bits, bits, TQ_NORM_BYTES)
    if match := _TQ_SPLIT.fullmatch(key):
        k_bits = _tq_bits(match.group(1), raw)
        v_bits = _tq_bits(match.group(2), raw)
        if k_bits == v_bits:
            return KvDtype(f"tq{k_bits}", k_bits, v_bits, TQ_NORM_BYTES)
        return KvDtype(f"tq{k_bits}k{v_bits}v", k_bits, v_bits, TQ_NORM_BYTES)
    raise ValueError(
        f"unknown KV dtype {raw!r}; use one of {', '.join(KNOWN_KV_DTYPES)} (e.g. tq4, tq3k4v)"
    )


@dataclass(frozen=True)
class AttentionShape:
    """What the KV cache of one model stores per token.

    Standard attention needs ``kv_heads`` and ``head_dim``; MLA is selected by giving
    ``kv_lora_rank`` and ``rope_head_dim`` (``kv_heads`` / ``head_dim`` are then unused).
    """

    layers: int
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None
    rope_head_dim: int | None = None

    def __post_init__(self) -> None:
        require_positive_int(self.layers, "layers")
        if self.kv_lora_rank is not None or self.rope_head_dim is not None:
            if self.kv_lora_rank is None or self.rope_head_dim is None:
                raise ValueError("MLA needs both kv_lora_rank and rope_head_dim (qk_rope_head_dim)")
            require_positive_int(self.kv_lora_rank, "kv_lora_rank")
            require_positive_int(self.rope_head_dim, "rope_head_dim")
            return
        if self.kv_heads is None or self.head_dim is None:
            raise ValueError("standard attention needs kv_heads and head_dim")
        require_positive_int(self.kv_heads, "kv_heads")
        require_positive_int(self.head_dim, "head_dim")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_shard_limit(self) -> int:
        """Most GPUs the KV cache can be split across with tensor parallelism.

        GQA/MHA shard by KV head; beyond ``kv_heads`` GPUs vLLM replicates heads, so a GPU never
        holds less than one head. MLA's latent is shared by all heads and replicated on every
        rank (KAITO #2139), so it never shrinks.
        """
        if self.kv_lora_rank is not None:
            return 1
        assert self.kv_heads is not None
        return self.kv_heads


def kv_bytes_per_token(shape: AttentionShape, kv_dtype: KvDtype | str) -> int:
    """KV-cache bytes one token occupies across all layers (whole model, one GPU's worth)."""
    dtype = parse_kv_dtype(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
    if shape.kv_lora_rank is not None:
        assert shape.rope_head_dim is not None
        if dtype.key_bits != dtype.value_bits:
            raise ValueError(
                f"KV dtype {dtype.name!r} has separate key/value widths, "
                "but MLA caches one shared latent vector"
            )
        latent = shape.kv_lora_rank + shape.rope_head_dim
        return shape.layers * vector_bytes(dtype.key_bits, latent, dtype.norm_bytes)
    assert shape.kv_heads is not None
    assert shape.head_dim is not None
    per_head = vector_bytes(dtype.key_bits, shape.head_dim, dtype.norm_bytes) + vector_bytes(
        dtype.value_bits, shape.head_dim, dtype.norm_bytes
    )
    return shape.layers * shape.kv_heads * per_head


def kv_cache_bytes(bytes_per_token: int, context_tokens: int, sequences: int = 1) -> int:
    """KV cache for ``sequences`` concurrent sequences of ``context_tokens`` tokens each."""
    require_positive_int(bytes_per_token, "bytes per token")
    require_positive_int(context_tokens, "context tokens")
    require_positive_int(sequences, "sequences")
    return bytes_per_token * context_tokens * sequences


def compression_vs_fp16(shape: AttentionShape, kv_dtype: KvDtype | str) -> float:
    """How many times smaller than fp16 the cache is (e.g. 3.76 for tq4 at head_dim 128)."""
    return kv_bytes_per_token(shape, "fp16") / kv_bytes_per_token(shape, kv_dtype)

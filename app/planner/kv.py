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

- vLLM's TurboQuant cache dtypes, sized exactly as vLLM 0.33 lays them out
  (``vllm/model_executor/layers/quantization/turboquant/config.py``, ``TurboQuantConfig``):

  ``turboquant_k8v4`` (FP8 keys, 4-bit values), ``turboquant_4bit_nc``, ``turboquant_k3v4_nc``
  and ``turboquant_3bit_nc`` (``TQ_PRESETS``). One slot per KV head and token holds the key and
  the value (``slot_size``): key ``ceil(d x key_bits / 8) + 2`` (MSE indices + an fp16
  ``vec_norm``; FP8 keys are ``d`` bytes, no norm: ``key_packed_size``), value
  ``ceil(d x value_bits / 8) + 4`` (fp16 scale and zero: ``value_packed_size``), the sum
  rounded up to an even number (``slot_size_aligned``, which
  ``TurboQuantAttentionBackend.customize_spec`` in ``vllm/v1/attention/backends/
  turboquant_attn.py`` makes the page's per-head bytes). The first and last
  ``min(2, layers // 2)`` layers keep the model's own dtype
  (``TurboQuantConfig.get_boundary_skip_layers``, added to ``kv_cache_dtype_skip_layers`` by
  ``EngineArgs.create_engine_config`` in ``vllm/engine/arg_utils.py``; a skipped layer's cache
  dtype is ``auto``, ``vllm/model_executor/layers/attention/attention.py``). All layers are
  full attention with one block size, so vLLM puts them in one group whose page is the sum of
  the layers' pages (``UniformTypeKVCacheSpecs.page_size_bytes``,
  ``vllm/v1/kv_cache_interface.py``): bytes per token = the sum over layers. Qwen3-8B (36
  layers, 8 KV heads, d = 128) in ``turboquant_4bit_nc``: slot (64 + 2) + (64 + 4) = 134,
  ``32 x 8 x 134 + 4 x 8 x 512 = 50,688`` bytes per token. vLLM turns boundary protection off
  for hybrid (attention + Mamba) models; the planner, which counts every layer as attention,
  assumes a dense model. vLLM has no TurboQuant backend for MLA, so MLA models refuse them.

Aliases accepted: ``float16``/``half``, ``bfloat16``, ``float32``/``float``, ``fp8_e4m3``/
``fp8_e5m2``, and the TurboQuant article's ``tq-t4nc``/``tq-k3v4nc`` (its patched vLLM 0.19
fork's names, sized by the ``tqN`` packing rule above; vLLM 0.33 takes the ``turboquant_*``
names instead).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from app.planner.units import FLOAT_ALIASES, require_positive_int

#: Bytes of the per-vector norm stored next to every packed ``tq`` vector.
TQ_NORM_BYTES = 4

_PLAIN_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8}

_ALIASES = {
    **FLOAT_ALIASES,
    # The TurboQuant article's flag values (its vLLM 0.19 fork).
    "tq-t4nc": "tq4",
    "tq-k3v4nc": "tq3k4v",
}

#: vLLM 0.33's TurboQuant presets: (key bits, value bits); 8-bit keys are FP8
#: (`TQ_PRESETS`, vllm/model_executor/layers/quantization/turboquant/config.py).
TURBOQUANT_PRESETS: dict[str, tuple[int, int]] = {
    "turboquant_k8v4": (8, 4),
    "turboquant_4bit_nc": (4, 4),
    "turboquant_k3v4_nc": (3, 4),
    "turboquant_3bit_nc": (3, 3),
}
#: Layers kept at the model's dtype at each end of a dense model (`get_boundary_skip_layers`'s
#: default `n`, vllm/model_executor/layers/quantization/turboquant/config.py).
TURBOQUANT_BOUNDARY_LAYERS = 2

_TQ_SYMMETRIC = re.compile(r"tq(\d+)")
_TQ_SPLIT = re.compile(r"tq(\d+)k(\d+)v")

KNOWN_KV_DTYPES = (
    "fp32",
    "fp16",
    "bf16",
    "fp8",
    "tqN",
    "tqKkVv",
    *TURBOQUANT_PRESETS,
    "auto",
)


@dataclass(frozen=True)
class KvDtype:
    """One KV-cache storage format: bits per key / value element and per-vector norm bytes.

    ``turboquant``: vLLM's TurboQuant slot layout, with its boundary layers at ``native_bits``
    (the model's dtype) instead of ``norm_bytes`` (see the module docstring).
    """

    name: str
    key_bits: int
    value_bits: int
    norm_bytes: int = 0
    turboquant: bool = False
    native_bits: int = 16

    @property
    def packed(self) -> bool:
        """True for vector-quantised formats (a norm or scale next to every vector)."""
        return self.norm_bytes > 0 or self.turboquant


def turboquant_slot_bytes(key_bits: int, value_bits: int, head_dim: int) -> int:
    """Bytes of one KV head's key + value at one token in vLLM's TurboQuant layout.

    `TurboQuantConfig.slot_size_aligned` (vllm/model_executor/layers/quantization/turboquant/
    config.py): key `ceil(d x bits / 8) + 2` (fp16 norm) or `d` for FP8 keys
    (`key_packed_size`), value `ceil(d x bits / 8) + 4` (fp16 scale and zero,
    `value_packed_size`), the sum rounded up to even.
    """
    key = head_dim if key_bits == 8 else -(-head_dim * key_bits // 8) + 2
    value = -(-head_dim * value_bits // 8) + 4
    slot = key + value
    return slot + slot % 2


def turboquant_boundary_layers(layers: int) -> int:
    """Layers vLLM keeps at the model's dtype: the first and last `min(2, layers // 2)`.

    `TurboQuantConfig.get_boundary_skip_layers` (dense models) in
    vllm/model_executor/layers/quantization/turboquant/config.py.
    """
    n = min(TURBOQUANT_BOUNDARY_LAYERS, layers // 2)
    if n <= 0:
        return 0
    return len(set(range(n)) | set(range(layers - n, layers)))


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
    if key in TURBOQUANT_PRESETS:
        key_bits, value_bits = TURBOQUANT_PRESETS[key]
        # Boundary layers are cached as `auto`: the model's dtype.
        native = parse_kv_dtype("auto", model_dtype=model_dtype or "bf16")
        return KvDtype(key, key_bits, value_bits, turboquant=True, native_bits=native.key_bits)
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
    if dtype.turboquant:
        return _turboquant_bytes_per_token(shape, dtype)
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


def _turboquant_bytes_per_token(shape: AttentionShape, dtype: KvDtype) -> int:
    """Packed layers' slots plus the boundary layers at the model's dtype (module docstring)."""
    if shape.is_mla:
        # Only TurboQuantAttentionBackend (vllm/v1/attention/backends/turboquant_attn.py, standard
        # decoder attention) takes turboquant_* cache dtypes; no MLA backend lists them.
        raise ValueError(f"KV dtype {dtype.name!r}: vLLM has no TurboQuant backend for MLA models")
    assert shape.kv_heads is not None
    assert shape.head_dim is not None
    boundary = turboquant_boundary_layers(shape.layers)
    slot = turboquant_slot_bytes(dtype.key_bits, dtype.value_bits, shape.head_dim)
    native = 2 * vector_bytes(dtype.native_bits, shape.head_dim)
    return shape.kv_heads * ((shape.layers - boundary) * slot + boundary * native)


def kv_cache_bytes(bytes_per_token: int, context_tokens: int, sequences: int = 1) -> int:
    """KV cache for ``sequences`` concurrent sequences of ``context_tokens`` tokens each."""
    require_positive_int(bytes_per_token, "bytes per token")
    require_positive_int(context_tokens, "context tokens")
    require_positive_int(sequences, "sequences")
    return bytes_per_token * context_tokens * sequences


#: vLLM's KV-cache block in tokens (`CacheConfig.DEFAULT_BLOCK_SIZE`, vllm/config/cache.py:185);
#: some attention backends (FlashMLA, ...) force a larger one.
VLLM_BLOCK_SIZE = 16


def _blocks_per_request(max_model_len: int, block_size: int) -> int:
    """Blocks one request of `max_model_len` tokens takes: `cdiv(max_model_len, block_size)`
    pages (`FullAttentionSpec.max_memory_usage_bytes`, vllm/v1/kv_cache_interface.py:643-648).
    """
    require_positive_int(max_model_len, "max_model_len")
    require_positive_int(block_size, "block size")
    return -(-max_model_len // block_size)


def one_request_kv_bytes(
    bytes_per_token: float, max_model_len: int, block_size: int = VLLM_BLOCK_SIZE
) -> int:
    """The least KV cache vLLM starts with: one request of `max_model_len` tokens.

    vLLM gives the KV cache what its memory budget leaves (it does not reserve
    `max_model_len x max_num_seqs`) and refuses to start only when that cannot hold one
    request of `max_model_len` tokens, in whole blocks, after the null block its block pool
    holds back: `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_planning.py:151-184,
    "To serve at least one request with the model's max seq len (...)" at :75). So: (blocks of
    one request + 1) x block_size x bytes per token. `bytes_per_token` is one GPU's share.
    """
    blocks = _blocks_per_request(max_model_len, block_size) + 1
    return math.ceil(blocks * block_size * bytes_per_token)


def max_concurrency(
    kv_bytes: float, bytes_per_token: float, max_model_len: int, block_size: int = VLLM_BLOCK_SIZE
) -> float:
    """Requests of `max_model_len` tokens a KV cache of `kv_bytes` holds at once.

    vLLM's "Maximum concurrency for N tokens per request: X" (`update_kv_cache_capacity`,
    vllm/v1/core/kv_cache_utils.py:1136-1154): whole blocks in the cache
    (`available_memory // bytes_per_block`, vllm/v1/core/kv_cache_planning.py:1571) over the
    blocks one request takes (`get_max_concurrency_for_kv_cache_config`, :1061).
    """
    if kv_bytes <= 0:
        return 0.0
    blocks = math.floor(kv_bytes / (block_size * bytes_per_token))
    return blocks / _blocks_per_request(max_model_len, block_size)


def compression_vs_fp16(shape: AttentionShape, kv_dtype: KvDtype | str) -> float:
    """How many times smaller than fp16 the cache is (e.g. 3.76 for tq4 at head_dim 128)."""
    return kv_bytes_per_token(shape, "fp16") / kv_bytes_per_token(shape, kv_dtype)

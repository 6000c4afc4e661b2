"""Weight memory from a parameter count and a weight format.

``weight_bytes = parameters x bytes_per_parameter`` with:

========================  =====================  ============================================
format                    bytes per parameter    notes
========================  =====================  ============================================
``fp32``                  4
``fp16``, ``bf16``        2
``fp8``, ``int8``         1                      per-channel / per-block scales ignored (<1%)
``int4``                  0.5 + 2/128            one fp16 scale per group of 128 weights
``awq``, ``gptq``         0.5 + 2.5/128          fp16 scale + packed 4-bit zero point per
                                                 group of 128 (= 0.51953125); GPTQ's act-order
                                                 index (4 bytes per input row) is ignored
========================  =====================  ============================================

Quantised checkpoints (everything below 2 bytes) normally keep the token embedding and the
LM head in 16 bits. Pass those as ``unquantized_params`` (see
:attr:`app.planner.model_info.ModelInfo.embedding_params`) and they are charged 2 bytes each. Norms,
biases and routers stay 16-bit too and are not counted, so a real AWQ/GPTQ checkpoint is a few
percent larger than this estimate; pass its real size (``--weights-gib``) when you have it.
"""

from __future__ import annotations

import math
from fractions import Fraction

from app.planner.units import FLOAT_ALIASES, require_positive_int

#: Weights per quantisation group for the 4-bit formats.
GROUP_SIZE = 128

BYTES_PER_PARAM: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "fp16": Fraction(2),
    "bf16": Fraction(2),
    "fp8": Fraction(1),
    "int8": Fraction(1),
    "int4": Fraction(1, 2) + Fraction(2, GROUP_SIZE),
    "awq": Fraction(1, 2) + Fraction(5, 2 * GROUP_SIZE),
    "gptq": Fraction(1, 2) + Fraction(5, 2 * GROUP_SIZE),
}

_ALIASES = {
    **FLOAT_ALIASES,
    "w8a8": "int8",
    "w4a16": "int4",
    "q4": "int4",
    "awq4": "awq",
    "gptq4": "gptq",
}

#: Bytes per parameter of what stays unquantised (embeddings, LM head).
UNQUANTIZED_BYTES = Fraction(2)


def normalize_weight_dtype(name: str) -> str:
    """Canonical weight-format name, or ``ValueError`` listing the known ones."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in BYTES_PER_PARAM:
        raise ValueError(
            f"unknown weight dtype {name!r}; use one of {', '.join(sorted(BYTES_PER_PARAM))}"
        )
    return key


def bytes_per_param(name: str) -> Fraction:
    """Exact bytes per parameter of a weight format (group scales included)."""
    return BYTES_PER_PARAM[normalize_weight_dtype(name)]


def served_dtype(torch_dtype: str | None) -> str:
    """The dtype vLLM's ``--dtype auto`` serves a checkpoint in: bf16 stays, else fp16."""
    if torch_dtype is None:
        return "bf16"
    return "bf16" if normalize_weight_dtype(torch_dtype) == "bf16" else "fp16"


def estimate_weight_bytes(params: int, dtype: str, *, unquantized_params: int = 0) -> int:
    """Bytes of ``params`` parameters stored as ``dtype`` (rounded up to a whole byte).

    ``unquantized_params`` (embeddings, LM head) are charged 16 bits when ``dtype`` is a
    sub-16-bit format; for 16/32-bit formats every parameter costs the same anyway.
    """
    require_positive_int(params, "parameter count")
    if isinstance(unquantized_params, bool) or unquantized_params < 0:
        raise ValueError(f"unquantized parameters must be >= 0, got {unquantized_params!r}")
    if unquantized_params > params:
        raise ValueError(
            f"unquantized parameters ({unquantized_params}) exceed the total ({params})"
        )
    per_param = bytes_per_param(dtype)
    if per_param >= UNQUANTIZED_BYTES:
        return math.ceil(params * per_param)
    quantized = params - unquantized_params
    return math.ceil(quantized * per_param + unquantized_params * UNQUANTIZED_BYTES)


def params_from_billions(billions: float) -> int:
    """``8.03`` -> 8_030_000_000, rejecting non-positive or non-finite input."""
    if isinstance(billions, bool) or not math.isfinite(billions) or billions <= 0:
        raise ValueError(f"parameter count (billions) must be a positive number, got {billions!r}")
    return round(billions * 1_000_000_000)

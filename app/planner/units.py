"""Memory units shared by the GPU planners.

Every planner works in bytes. GiB (2**30 bytes) is only used at the edges: flags such as
``--gpu-gib`` and human-readable output. GPU vendors sell "GB" (10**9) but drivers, NVML and
vLLM's logs report GiB, so that is what the flags mean.
"""

from __future__ import annotations

import math

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def gib_to_bytes(gib: float) -> int:
    """``gib`` GiB as a whole number of bytes (rounded to the nearest byte)."""
    if not math.isfinite(gib):
        raise ValueError(f"expected a finite number of GiB, got {gib!r}")
    return round(gib * GIB)


def bytes_to_gib(n_bytes: float) -> float:
    """``n_bytes`` in GiB, unrounded."""
    return n_bytes / GIB


def require_positive(value: float, what: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number, got {value!r}")


def require_non_negative(value: float, what: str) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number >= 0."""
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be zero or a positive number, got {value!r}")


def require_positive_int(value: int, what: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an ``int`` > 0 (``bool`` is not accepted)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")


#: Spellings of the floating-point formats (torch, Hugging Face `torch_dtype`, vLLM flags),
#: shared by the KV-cache and the weight formats.
FLOAT_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}

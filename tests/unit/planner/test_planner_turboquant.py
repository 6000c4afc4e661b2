"""vLLM 0.33's TurboQuant KV cache, sized as vLLM lays it out.

From vllm/model_executor/layers/quantization/turboquant/config.py (`TurboQuantConfig`):

- key_packed_size = d (FP8 keys, key_quant_bits 8) else ceil(d x key_bits / 8) + 2 (fp16 norm);
- value_packed_size = ceil(d x value_bits / 8) + 4 (fp16 scale + zero);
- slot_size_aligned = key + value, rounded up to even (one slot per KV head per token);
- get_boundary_skip_layers: the first and last min(2, layers // 2) layers of a dense model keep
  the model's dtype, 2 x d x 2 bytes per KV head (bf16/fp16).

Bytes per token = kv_heads x ((layers - boundary) x slot + boundary x 2 x d x 2).
"""

from __future__ import annotations

import pytest

from app.planner.footprint import backend_instance
from app.planner.kv import (
    AttentionShape,
    kv_bytes_per_token,
    parse_kv_dtype,
    turboquant_boundary_layers,
    turboquant_slot_bytes,
)
from app.settings import BackendConfig
from tests.unit.cli.test_plan_cli import run_json
from tests.unit.planner.test_model_description import clean_env  # noqa: F401 (autouse)

QWEN3_8B = AttentionShape(layers=36, kv_heads=8, head_dim=128)
R1_14B = AttentionShape(layers=48, kv_heads=8, head_dim=128)


@pytest.mark.parametrize(
    ("name", "slot"),
    [
        # FP8 keys: 128; values ceil(128 x 4 / 8) + 4 = 68; 196 is even.
        ("turboquant_k8v4", 128 + 68),
        # keys ceil(128 x 4 / 8) + 2 = 66; values 64 + 4 = 68; 134.
        ("turboquant_4bit_nc", 66 + 68),
        # keys ceil(128 x 3 / 8) + 2 = 48 + 2 = 50; values 68; 118.
        ("turboquant_k3v4_nc", 50 + 68),
        # keys 50; values 48 + 4 = 52; 102.
        ("turboquant_3bit_nc", 50 + 52),
    ],
)
def test_slot_bytes_at_head_dim_128(name: str, slot: int) -> None:
    dtype = parse_kv_dtype(name, model_dtype="bf16")
    assert turboquant_slot_bytes(dtype.key_bits, dtype.value_bits, 128) == slot


def test_an_odd_slot_is_rounded_up_to_even() -> None:
    # d = 66, k8v4: key 66 + value ceil(66 x 4 / 8) + 4 = 33 + 4 = 37 -> 103 -> 104.
    assert turboquant_slot_bytes(8, 4, 66) == 104
    # d = 70, 3-bit: key ceil(210 / 8) + 2 = 27 + 2 = 29, value 27 + 4 = 31 -> 60 (even).
    assert turboquant_slot_bytes(3, 3, 70) == 60


@pytest.mark.parametrize(
    ("layers", "boundary"),
    [
        (1, 0),  # n = min(2, 1 // 2) = 0: nothing skipped
        (2, 2),  # n = 1: layers {0} | {1}
        (3, 2),  # n = 1: {0} | {2}
        (4, 4),  # n = 2: {0, 1} | {2, 3}
        (5, 4),  # n = 2: {0, 1} | {3, 4}
        (36, 4),  # {0, 1} | {34, 35}
    ],
)
def test_boundary_layers(layers: int, boundary: int) -> None:
    assert turboquant_boundary_layers(layers) == boundary


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        # 32 packed layers x 8 heads x slot + 4 boundary layers x 8 heads x (128 + 128) x 2.
        ("turboquant_k8v4", 32 * 8 * 196 + 4 * 8 * 512),  # 50,176 + 16,384 = 66,560
        ("turboquant_4bit_nc", 32 * 8 * 134 + 4 * 8 * 512),  # 34,304 + 16,384 = 50,688
        ("turboquant_k3v4_nc", 32 * 8 * 118 + 4 * 8 * 512),  # 30,208 + 16,384 = 46,592
        ("turboquant_3bit_nc", 32 * 8 * 102 + 4 * 8 * 512),  # 26,112 + 16,384 = 42,496
    ],
)
def test_qwen3_8b_bytes_per_token(name: str, per_token: int) -> None:
    assert kv_bytes_per_token(QWEN3_8B, parse_kv_dtype(name, model_dtype="bf16")) == per_token


def test_the_4bit_preset_is_not_the_generic_tq4_packing() -> None:
    # The generic tq4 rule (the article's fork) was what turboquant_4bit_nc used to be sized by:
    # 36 x 8 x (68 + 68) = 39,168 B/token, 23% under vLLM's 50,688.
    assert kv_bytes_per_token(QWEN3_8B, "tq4") == 39_168
    assert kv_bytes_per_token(QWEN3_8B, "turboquant_4bit_nc") == 50_688


def test_a_three_layer_model_keeps_two_layers_native() -> None:
    # 3 layers, 1 KV head, d = 128: boundary {0, 2}; 1 x 134 + 2 x 512 = 1,158.
    shape = AttentionShape(layers=3, kv_heads=1, head_dim=128)
    assert kv_bytes_per_token(shape, "turboquant_4bit_nc") == 1_158
    # One layer: nothing skipped, one slot.
    one = AttentionShape(layers=1, kv_heads=1, head_dim=128)
    assert kv_bytes_per_token(one, "turboquant_4bit_nc") == 134


def test_boundary_layers_take_the_models_16_bit_dtype() -> None:
    # An fp32 checkpoint is served (and cached under `auto`) in fp16: 2 bytes per element.
    fp32 = parse_kv_dtype("turboquant_4bit_nc", model_dtype="float32")
    assert fp32.native_bits == 16
    assert kv_bytes_per_token(QWEN3_8B, fp32) == 50_688


def test_mla_models_refuse_turboquant() -> None:
    deepseek = AttentionShape(layers=61, kv_lora_rank=512, rope_head_dim=64)
    with pytest.raises(ValueError, match="no TurboQuant backend for MLA"):
        kv_bytes_per_token(deepseek, "turboquant_4bit_nc")


def test_plan_kv_prints_vllms_size(capsys: pytest.CaptureFixture[str]) -> None:
    # R1-Distill-14B: 44 x 8 x 134 + 4 x 8 x 512 = 47,168 + 16,384 = 63,552 B/token;
    # x 8,192 tokens = 520,617,984 B.
    data = run_json(
        [
            "plan",
            "kv",
            "--model",
            "deepseek-r1-distill-qwen-14b",
            "--kv-dtype",
            "turboquant_4bit_nc",
            "--context",
            "8192",
        ],
        capsys,
    )
    assert data["kv_dtype"] == "turboquant_4bit_nc"
    assert data["kv_bytes_per_token"] == 63_552
    assert data["kv_cache_bytes"] == 63_552 * 8192 == 520_617_984


def test_a_described_backend_is_planned_and_started_with_vllms_name() -> None:
    config = BackendConfig.model_validate(
        {
            "url": "http://127.0.0.1:8000",
            "models": ["m"],
            "model_info": {
                "catalog": "qwen3-8b",
                "kv_dtype": "turboquant_k3v4_nc",
                "max_model_len": 8192,
                "max_num_seqs": 2,
            },
        }
    )
    spec = backend_instance(config)
    assert spec is not None
    # 46,592 B/token x one request of 8,192 tokens (512 blocks + the null block of 16):
    # max_num_seqs 2 does not multiply it.
    assert spec.kv_bytes == 46_592 * 513 * 16

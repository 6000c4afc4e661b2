"""KV-cache bytes per token: worked numbers checked by hand in the comments."""

from __future__ import annotations

import pytest

from app.planner.kv import (
    AttentionShape,
    KvDtype,
    compression_vs_fp16,
    kv_bytes_per_token,
    kv_cache_bytes,
    parse_kv_dtype,
    vector_bytes,
)
from app.planner.units import GIB, MIB
from app.planner.weights import normalize_weight_dtype

QWEN3_30B_A3B = AttentionShape(layers=48, kv_heads=4, head_dim=128)
R1_DISTILL_14B = AttentionShape(layers=48, kv_heads=8, head_dim=128)
QWEN3_8B = AttentionShape(layers=36, kv_heads=8, head_dim=128)
LLAMA_31_8B = AttentionShape(layers=32, kv_heads=8, head_dim=128)
DEEPSEEK_V3 = AttentionShape(layers=61, kv_lora_rank=512, rope_head_dim=64)


# ---------------------------------------------------------------- kv-cache-memory.txt


def test_qwen3_30b_a3b_fp16_bytes_per_token() -> None:
    # 2 (K+V) x 48 layers x 4 KV heads x 128 dims x 2 bytes = 98,304 bytes (96 KiB).
    assert kv_bytes_per_token(QWEN3_30B_A3B, "fp16") == 98_304


def test_qwen3_30b_a3b_16k_tokens_32_sequences_is_48_gib() -> None:
    # 98,304 x 16,384 x 32 = 51,539,607,552 bytes = 48 x 2**30.
    total = kv_cache_bytes(98_304, 16_384, 32)
    assert total == 51_539_607_552
    assert total == 48 * GIB


@pytest.mark.parametrize(
    ("context", "seqs", "expected"),
    [
        # Scenario 1: 98,304 x 16,384 x 128 = 206,158,430,208 bytes = 192 GiB.
        (16_384, 128, 206_158_430_208),
        # Scenario 2: 98,304 x 16,384 x 8 = 12,884,901,888 bytes = 12 GiB.
        (16_384, 8, 12_884_901_888),
        # Phase 1: 98,304 x 8,192 x 32 = 25,769,803,776 bytes = 24 GiB.
        (8_192, 32, 25_769_803_776),
        # Phase 4: 98,304 x 60,000 x 8 = 47,185,920,000 bytes = 43.9 GiB (the article's
        # "68.7GB just for KV cache" right after it is wrong).
        (60_000, 8, 47_185_920_000),
    ],
)
def test_kv_cache_memory_article_scenarios(context: int, seqs: int, expected: int) -> None:
    per_token = kv_bytes_per_token(QWEN3_30B_A3B, "bf16")
    assert kv_cache_bytes(per_token, context, seqs) == expected


def test_article_per_token_claim_of_1_03_mb_is_ten_times_too_big() -> None:
    # The article explains 66 GB with "8 sequences x 10k tokens x 1.03MB/token"; the real cost is
    # 96 KiB per token: 98,304 x 10,000 x 8 = 7,864,320,000 bytes = 7.3 GiB.
    assert kv_cache_bytes(98_304, 10_000, 8) == 7_864_320_000
    assert kv_bytes_per_token(QWEN3_30B_A3B, "fp16") < 0.1 * MIB


# ---------------------------------------------------------------- two-vllm-instances article


def test_r1_distill_14b_8k_sequence_counts_keys_and_values() -> None:
    # 2 x 48 x 8 x 128 x 2 = 196,608 bytes per token; x 8,192 = 1,610,612,736 = 1.5 GiB.
    # The article's "768 MB" (805,306,368 bytes) is exactly half: it counted only the keys.
    per_token = kv_bytes_per_token(R1_DISTILL_14B, "fp16")
    assert per_token == 196_608
    assert kv_cache_bytes(per_token, 8_192) == 1_610_612_736
    assert kv_cache_bytes(per_token, 8_192) == 2 * 805_306_368


def test_tq4_packs_a_128_dim_vector_in_68_bytes() -> None:
    # 128 x 4 bits = 64 bytes + 4-byte norm = 68; fp16 is 128 x 2 = 256 bytes.
    assert vector_bytes(4, 128, 4) == 68
    assert vector_bytes(16, 128) == 256
    # "3.8x" in the article is 256 / 68 = 3.7647...
    assert compression_vs_fp16(R1_DISTILL_14B, "tq4") == pytest.approx(256 / 68)
    assert compression_vs_fp16(R1_DISTILL_14B, "tq4") < 3.8


def test_r1_distill_14b_tq4_at_8k_is_about_0_4_gib() -> None:
    # 48 layers x 8 heads x (68 + 68) = 52,224 bytes/token; x 8,192 = 427,819,008 B = 0.398 GiB.
    # The article's table says 3.0 GiB (fp16) and 0.79 GiB (tq4) "@ 8K", twice the real numbers.
    per_token = kv_bytes_per_token(R1_DISTILL_14B, "tq4")
    assert per_token == 52_224
    assert kv_cache_bytes(per_token, 8_192) == 427_819_008
    assert kv_cache_bytes(per_token, 8_192) / GIB == pytest.approx(0.3984375)


def test_qwen3_8b_orchestrator_40k_context() -> None:
    # The article's Nemotron-8B orchestrator is Qwen3-8B shaped (36 layers, 8 KV heads, 128).
    # fp16: 2 x 36 x 8 x 128 x 2 = 147,456 B/token; x 40,960 = 6,039,797,760 B = 5.625 GiB
    # ("~6.1 GB" in decimal GB). tq4: 36 x 8 x 136 = 39,168 B/token; x 40,960 = 1,604,321,280 B
    # (1.6 GB decimal, 1.49 GiB). At 8K fp16 is 1.125 GiB, not the table's 2.0 GiB.
    assert kv_bytes_per_token(QWEN3_8B, "fp16") == 147_456
    assert kv_cache_bytes(147_456, 40_960) == 6_039_797_760
    assert kv_bytes_per_token(QWEN3_8B, "tq4") == 39_168
    assert kv_cache_bytes(39_168, 40_960) == 1_604_321_280
    assert kv_cache_bytes(147_456, 8_192) == int(1.125 * GIB)


# ---------------------------------------------------------------- formats


def test_tq3_and_split_tq3k4v() -> None:
    # tq3: 128 x 3 bits = 384 bits = 48 bytes + 4 = 52 bytes per vector.
    assert vector_bytes(3, 128, 4) == 52
    # tq3k4v: keys 52 + values 68 = 120 bytes per head per layer; Qwen3-8B: 36 x 8 x 120.
    assert kv_bytes_per_token(QWEN3_8B, "tq3") == 36 * 8 * (52 + 52) == 29_952
    assert kv_bytes_per_token(QWEN3_8B, "tq3k4v") == 36 * 8 * 120 == 34_560


def test_packed_bits_round_up_to_whole_bytes_per_vector() -> None:
    # head_dim 70 at 3 bits = 210 bits = 26.25 bytes -> 27 bytes, + 4-byte norm = 31 per vector.
    shape = AttentionShape(layers=1, kv_heads=1, head_dim=70)
    assert kv_bytes_per_token(shape, "tq3") == 2 * 31
    # 4 bits x 70 = 280 bits = 35 bytes exactly, + 4 = 39 per vector.
    assert kv_bytes_per_token(shape, "tq4") == 2 * 39
    # head_dim 72 at 3 bits = 216 bits = 27 bytes exactly, + 4 = 31.
    assert kv_bytes_per_token(AttentionShape(layers=1, kv_heads=1, head_dim=72), "tq3") == 62


def test_fp8_and_fp32() -> None:
    # Llama-3.1-8B: 2 x 32 x 8 x 128 x 1 byte = 65,536; fp32: x 4 bytes = 262,144.
    assert kv_bytes_per_token(LLAMA_31_8B, "fp8") == 65_536
    assert kv_bytes_per_token(LLAMA_31_8B, "fp32") == 262_144
    assert kv_bytes_per_token(LLAMA_31_8B, "bf16") == 131_072


def test_mla_caches_latent_plus_rope_without_factor_two_or_heads() -> None:
    # DeepSeek-V3: 61 layers x (512 + 64) elements x 2 bytes = 70,272 bytes per token.
    assert kv_bytes_per_token(DEEPSEEK_V3, "bf16") == 70_272
    # fp8: 61 x 576 x 1 = 35,136.
    assert kv_bytes_per_token(DEEPSEEK_V3, "fp8") == 35_136
    # tq4 packs the 576-element latent as one vector: 288 + 4 = 292 bytes x 61 = 17,812.
    assert kv_bytes_per_token(DEEPSEEK_V3, "tq4") == 17_812


def test_mla_rejects_split_key_value_formats() -> None:
    with pytest.raises(ValueError, match="shared latent"):
        kv_bytes_per_token(DEEPSEEK_V3, "tq3k4v")


def test_kv_shard_limit() -> None:
    assert DEEPSEEK_V3.kv_shard_limit == 1
    assert QWEN3_30B_A3B.kv_shard_limit == 4
    assert DEEPSEEK_V3.is_mla
    assert not QWEN3_30B_A3B.is_mla


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fp16", KvDtype("fp16", 16, 16)),
        ("float16", KvDtype("fp16", 16, 16)),
        ("BFloat16", KvDtype("bf16", 16, 16)),
        ("fp8_e5m2", KvDtype("fp8", 8, 8)),
        ("float32", KvDtype("fp32", 32, 32)),
        ("tq4", KvDtype("tq4", 4, 4, 4)),
        ("tq-t4nc", KvDtype("tq4", 4, 4, 4)),
        ("tq-k3v4nc", KvDtype("tq3k4v", 3, 4, 4)),
        ("turboquant_k8v4", KvDtype("turboquant_k8v4", 8, 4, turboquant=True)),
        ("tq4k4v", KvDtype("tq4", 4, 4, 4)),
    ],
)
def test_parse_kv_dtype(name: str, expected: KvDtype) -> None:
    assert parse_kv_dtype(name) == expected


def test_auto_follows_the_model_dtype_like_vllm() -> None:
    assert parse_kv_dtype("auto", model_dtype="bfloat16").name == "bf16"
    assert parse_kv_dtype("auto", model_dtype="float16").name == "fp16"
    # vLLM serves fp32 checkpoints in fp16 under --dtype auto.
    assert parse_kv_dtype("auto", model_dtype="float32").name == "fp16"
    with pytest.raises(ValueError, match="auto"):
        parse_kv_dtype("auto")


@pytest.mark.parametrize("name", ["fp7", "int4", "tq0", "tq9", "tq3k9v", "", "tq"])
def test_unknown_kv_dtypes_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="KV dtype"):
        parse_kv_dtype(name)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layers": 0, "kv_heads": 8, "head_dim": 128}, "layers must be a positive integer"),
        ({"layers": 32, "kv_heads": -1, "head_dim": 128}, "kv_heads must be a positive"),
        ({"layers": 32, "kv_heads": 8}, "needs kv_heads and head_dim"),
        ({"layers": 32, "kv_lora_rank": 512}, "MLA needs both"),
        ({"layers": 32, "kv_lora_rank": 512, "rope_head_dim": 0}, "rope_head_dim"),
        ({"layers": True, "kv_heads": 8, "head_dim": 128}, "layers must be a positive integer"),
    ],
)
def test_attention_shape_validation(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttentionShape(**kwargs)


@pytest.mark.parametrize(("context", "seqs"), [(0, 1), (1024, 0), (-5, 2)])
def test_kv_cache_bytes_rejects_non_positive_counts(context: int, seqs: int) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        kv_cache_bytes(98_304, context, seqs)


@pytest.mark.parametrize("spelling", ["float32", "float", "float16", "half", "bfloat16",
                                      "fp8_e4m3", "fp8_e5m2", "float8"])  # fmt: skip
def test_float_spellings_mean_the_same_for_kv_cache_and_weights(spelling: str) -> None:
    # One alias table serves both; fp8_e5m2 was once a KV dtype but not a weight dtype.
    kv = parse_kv_dtype(spelling, model_dtype="bf16")
    weights = normalize_weight_dtype(spelling)
    assert kv.name == weights

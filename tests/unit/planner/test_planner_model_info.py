"""config.json parsing, the built-in catalog and weight estimates."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest

from app.planner.catalog import CATALOG, catalog_model, catalog_names
from app.planner.kv import AttentionShape, kv_bytes_per_token
from app.planner.model_info import model_from_hf_config
from app.planner.units import GIB
from app.planner.weights import (
    bytes_per_param,
    estimate_weight_bytes,
    normalize_weight_dtype,
    params_from_billions,
    served_dtype,
)

# Trimmed copies of published config.json files (the fields the planner reads).
QWEN3_30B_A3B_CONFIG: dict[str, object] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "head_dim": 128,
    "hidden_size": 2048,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
PHI4_MINI_CONFIG: dict[str, object] = {
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 3072,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 200064,
}
LLAMA2_13B_CONFIG: dict[str, object] = {  # MHA, no num_key_value_heads, no head_dim
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 5120,
    "max_position_embeddings": 4096,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}
GEMMA3_12B_CONFIG: dict[str, object] = {  # language model nested under text_config
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "head_dim": 256,
        "hidden_size": 3840,
        "max_position_embeddings": 131072,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "sliding_window": 1024,
        "vocab_size": 262208,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
}
DEEPSEEK_V3_CONFIG: dict[str, object] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1536,
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
}


# ---------------------------------------------------------------- config.json


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    # hidden_size / heads = 2048 / 32 = 64, but Qwen3 says head_dim 128.
    model = model_from_hf_config(QWEN3_30B_A3B_CONFIG, name="qwen3")
    assert model.shape == AttentionShape(layers=48, kv_heads=4, head_dim=128)
    assert model.max_context == 40960
    assert model.torch_dtype == "bf16"
    assert kv_bytes_per_token(model.shape, "fp16") == 98_304
    # Untied: 2 x 151,936 x 2,048 embedding + LM-head parameters.
    assert model.embedding_params == 2 * 151_936 * 2_048


def test_gqa_without_head_dim_derives_it_from_hidden_size() -> None:
    # 3072 / 24 heads = 128; 8 KV heads (GQA). KAITO's preset: 2 x 32 x 8 x 128 x 2 = 131,072.
    model = model_from_hf_config(PHI4_MINI_CONFIG)
    assert model.shape == AttentionShape(layers=32, kv_heads=8, head_dim=128)
    assert kv_bytes_per_token(model.shape, "bf16") == 131_072
    assert model.embedding_params == 200_064 * 3_072  # tied: counted once


def test_mha_without_kv_heads_uses_attention_heads() -> None:
    # 40 KV heads (= attention heads), head_dim 5120 / 40 = 128:
    # 2 x 40 x 40 x 128 x 2 = 819,200 bytes per token.
    model = model_from_hf_config(LLAMA2_13B_CONFIG)
    assert model.shape == AttentionShape(layers=40, kv_heads=40, head_dim=128)
    assert kv_bytes_per_token(model.shape, "fp16") == 819_200
    assert model.torch_dtype == "fp16"
    # tie_word_embeddings absent -> assumed untied.
    assert model.embedding_params == 2 * 32_000 * 5_120


def test_attention_heads_are_read_for_tensor_parallel_checks() -> None:
    assert model_from_hf_config(LLAMA2_13B_CONFIG).attention_heads == 40
    no_heads = {k: v for k, v in LLAMA2_13B_CONFIG.items() if k != "num_attention_heads"}
    assert (
        model_from_hf_config(
            {**no_heads, "num_key_value_heads": 40, "head_dim": 128}
        ).attention_heads
        is None
    )


@pytest.mark.parametrize(
    ("name", "heads"),
    [
        ("llama-3.1-8b", 32),
        ("llama-3.1-70b", 64),
        ("qwen3-8b", 32),
        ("qwen3-30b-a3b", 32),
        ("qwen3-32b", 64),
        ("deepseek-r1-distill-qwen-14b", 40),
        ("mistral-7b-v0.3", 32),
        ("phi-4-mini", 24),
        ("gemma-3-12b", 16),
        ("deepseek-v3", 128),
        ("deepseek-v2-lite", 16),
    ],
)
def test_catalog_attention_heads(name: str, heads: int) -> None:
    # num_attention_heads of each config.json (the catalog's comments name them).
    assert catalog_model(name).attention_heads == heads


def test_text_config_is_read_first_and_top_level_fills_gaps() -> None:
    model = model_from_hf_config(GEMMA3_12B_CONFIG)
    assert model.shape == AttentionShape(layers=48, kv_heads=8, head_dim=256)
    assert model.max_context == 131072
    assert model.torch_dtype == "bf16"  # only at the top level
    # 2 x 48 x 8 x 256 x 2 = 393,216 bytes per token (sliding layers counted as full).
    assert kv_bytes_per_token(model.shape, "bf16") == 393_216


def test_mla_config() -> None:
    model = model_from_hf_config(DEEPSEEK_V3_CONFIG)
    assert model.shape == AttentionShape(layers=61, kv_lora_rank=512, rope_head_dim=64)
    assert model.shape.is_mla
    assert kv_bytes_per_token(model.shape, "bf16") == 61 * 576 * 2


def test_newer_dtype_key_and_integral_floats_are_accepted() -> None:
    config = {**PHI4_MINI_CONFIG, "num_hidden_layers": 32.0, "dtype": "float16"}
    del config["torch_dtype"]
    model = model_from_hf_config(config)
    assert model.shape.layers == 32
    assert model.torch_dtype == "fp16"


def test_null_kv_lora_rank_means_standard_attention() -> None:
    model = model_from_hf_config({**PHI4_MINI_CONFIG, "kv_lora_rank": None})
    assert not model.shape.is_mla


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_attention_heads": 8, "hidden_size": 512}, "no num_hidden_layers"),
        (
            {"text_config": {"hidden_size": 512}, "num_attention_heads": 8},
            r"no num_hidden_layers \(looked in text_config too\)",
        ),
        (
            {"num_hidden_layers": 4, "hidden_size": 500, "num_attention_heads": 3},
            "not divisible",
        ),
        ({"num_hidden_layers": 4, "num_attention_heads": 8}, "no hidden_size"),
        ({"num_hidden_layers": 4, "head_dim": 64}, "neither num_key_value_heads"),
        ({"num_hidden_layers": -2, "num_attention_heads": 8, "head_dim": 64}, "positive integer"),
        ({"num_hidden_layers": True, "num_attention_heads": 8, "head_dim": 64}, "positive"),
        ({"num_hidden_layers": "32", "num_attention_heads": 8, "head_dim": 64}, "positive"),
        ({"num_hidden_layers": 4, "kv_lora_rank": 512}, "qk_rope_head_dim"),
        (
            {"num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "torch_dtype": 3},
            "torch_dtype must be a string",
        ),
        (
            {"num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "dtype": "int3"},
            "unknown weight dtype",
        ),
    ],
)
def test_bad_configs_give_clear_errors(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model_from_hf_config(config)


# ---------------------------------------------------------------- catalog


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "head_dim", "limit", "bf16_bytes_per_token"),
    [
        # 2 x layers x kv_heads x head_dim x 2 bytes, by hand:
        ("llama-3.1-8b", 32, 8, 128, 131072, 131_072),  # 2*32*8*128*2
        ("llama-3.1-70b", 80, 8, 128, 131072, 327_680),  # 2*80*8*128*2
        ("qwen3-8b", 36, 8, 128, 40960, 147_456),  # 2*36*8*128*2
        ("qwen3-30b-a3b", 48, 4, 128, 40960, 98_304),  # 2*48*4*128*2
        ("qwen3-32b", 64, 8, 128, 40960, 262_144),  # 2*64*8*128*2
        ("deepseek-r1-distill-qwen-14b", 48, 8, 128, 131072, 196_608),  # 2*48*8*128*2
        ("mistral-7b-v0.3", 32, 8, 128, 32768, 131_072),  # 2*32*8*128*2
        ("phi-4-mini", 32, 8, 128, 131072, 131_072),  # 2*32*8*128*2
        ("gemma-3-12b", 48, 8, 256, 131072, 393_216),  # 2*48*8*256*2
    ],
)
def test_catalog_gqa_models(
    name: str, layers: int, kv_heads: int, head_dim: int, limit: int, bf16_bytes_per_token: int
) -> None:
    model = catalog_model(name)
    assert model.shape == AttentionShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    assert model.max_context == limit
    assert kv_bytes_per_token(model.shape, "bf16") == bf16_bytes_per_token
    assert model.params is not None
    assert model.source


def test_catalog_mla_models() -> None:
    # DeepSeek-V3: 61 x (512 + 64) x 2 = 70,272; V2-Lite: 27 x 576 x 2 = 31,104.
    assert kv_bytes_per_token(catalog_model("deepseek-v3").shape, "bf16") == 70_272
    assert kv_bytes_per_token(catalog_model("deepseek-v2-lite").shape, "bf16") == 31_104


def test_catalog_lookup_by_hf_id_and_case() -> None:
    assert catalog_model("Qwen/Qwen3-30B-A3B") is CATALOG["qwen3-30b-a3b"]
    assert catalog_model("  PHI-4-MINI ") is CATALOG["phi-4-mini"]
    assert catalog_model("microsoft/Phi-4-mini-instruct") is CATALOG["phi-4-mini"]
    assert "qwen3-8b" in catalog_names()


def test_unknown_catalog_model_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'; known: .*qwen3-8b"):
        catalog_model("gpt-5")


# ---------------------------------------------------------------- weights


def test_bytes_per_param_with_group_scales() -> None:
    assert bytes_per_param("bf16") == 2
    assert bytes_per_param("fp8") == 1
    # int4: 0.5 + one fp16 scale (2 bytes) per 128 weights = 0.515625.
    assert bytes_per_param("int4") == Fraction(33, 64)
    # AWQ/GPTQ: 0.5 + (2-byte scale + 0.5-byte zero) / 128 = 0.51953125.
    assert bytes_per_param("awq") == Fraction(133, 256)
    assert float(bytes_per_param("GPTQ")) == 0.51953125


def test_estimate_weight_bytes() -> None:
    assert estimate_weight_bytes(8_000_000_000, "bf16") == 16_000_000_000
    assert estimate_weight_bytes(8_000_000_000, "fp8") == 8_000_000_000
    # 8e9 x 0.51953125 = 4,156,250,000.
    assert estimate_weight_bytes(8_000_000_000, "awq") == 4_156_250_000
    # 7e9 quantised x 0.51953125 + 1e9 kept in 16 bits x 2 = 3,636,718,750 + 2,000,000,000.
    assert (
        estimate_weight_bytes(8_000_000_000, "awq", unquantized_params=1_000_000_000)
        == 5_636_718_750
    )
    # Unquantised parameters change nothing for a 16-bit checkpoint.
    assert estimate_weight_bytes(8_000_000_000, "bf16", unquantized_params=10**9) == 16 * 10**9


def test_awq_r1_distill_14b_is_close_to_the_articles_9_4_gib() -> None:
    # 14.8e9 params; embeddings + LM head 2 x 152,064 x 5,120 = 1,557,135,360 stay 16-bit:
    # 13,242,864,640 x 133/256 = 6,880,082,020 + 1,557,135,360 x 2 = 3,114,270,720
    # = 9,994,352,740 bytes = 9.31 GiB (the article measured 9.4 GiB).
    model = catalog_model("deepseek-r1-distill-qwen-14b")
    assert model.embedding_params == 1_557_135_360
    assert model.weight_bytes("awq") == 9_994_352_740
    assert 9.2 < model.weight_bytes("awq") / GIB < 9.4


def test_phi4_mini_bf16_weights_match_kaito_checkpoint_size() -> None:
    # 3.84e9 x 2 = 7.68e9 bytes = 7.15 GiB, KAITO's model_file_size_gb for Phi-4-mini.
    assert catalog_model("phi-4-mini").weight_bytes("bf16") / GIB == pytest.approx(7.15, abs=0.01)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: estimate_weight_bytes(0, "bf16"), "parameter count"),
        (lambda: estimate_weight_bytes(10, "int3"), "unknown weight dtype"),
        (lambda: estimate_weight_bytes(10, "awq", unquantized_params=11), "exceed"),
        (lambda: estimate_weight_bytes(10, "awq", unquantized_params=-1), ">= 0"),
        (lambda: params_from_billions(-1.0), "positive"),
        (lambda: params_from_billions(float("nan")), "positive"),
        (lambda: catalog_model("qwen3-8b").weight_bytes("bf16", 0), "parameter count"),
    ],
)
def test_weight_errors(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_dtype_helpers() -> None:
    assert normalize_weight_dtype("BFloat16") == "bf16"
    assert served_dtype("float32") == "fp16"
    assert served_dtype("bfloat16") == "bf16"
    assert served_dtype(None) == "bf16"
    assert params_from_billions(8.03) == 8_030_000_000

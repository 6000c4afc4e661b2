"""A tensor-parallel size vLLM refuses for the model is a configuration error, in vLLM's
words (issue 37, item 2): the attention heads must divide by it
(vllm/config/model.py:1557-1564), and the KV heads must split or replicate evenly over it
(vllm/model_executor/layers/linear.py:1066-1071)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.planner.catalog import catalog_model
from app.planner.kv import AttentionShape
from app.planner.model_info import ModelInfo, model_from_hf_config
from app.planner.parallel import accepted_sizes, tensor_parallel_problem
from tests.unit.planner.test_model_description import PINNED, R1_CONFIG, load, problems


def gqa(heads: int | None, kv_heads: int) -> ModelInfo:
    shape = AttentionShape(layers=2, kv_heads=kv_heads, head_dim=128)
    return ModelInfo(name="m", shape=shape, attention_heads=heads)


def test_a_size_that_does_not_divide_the_attention_heads_is_refused_in_vllms_words() -> None:
    problem = tensor_parallel_problem(catalog_model("qwen3-8b"), 3)  # 32 heads, 8 KV heads
    assert problem is not None
    assert problem.startswith(
        "Total number of attention heads (32) must be divisible by tensor parallel size (3)."
    )
    assert "vllm/config/model.py:1557-1564" in problem
    assert accepted_sizes(catalog_model("qwen3-8b")) == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "words"),
    [
        (48, 8, 3, "8 is not divisible by 3"),  # 48 heads split over 3, 8 KV heads do not
        (28, 4, 7, "7 is not divisible by 4"),  # Qwen2.5-7B's heads over 7: KV 4 < 7
        (None, 8, 6, "8 is not divisible by 6"),  # a shape without heads: only the KV rule
    ],
)
def test_kv_heads_that_neither_split_nor_replicate_evenly_are_refused(
    heads: int | None, kv_heads: int, tp: int, words: str
) -> None:
    problem = tensor_parallel_problem(gqa(heads, kv_heads), tp)
    assert problem is not None
    assert problem.startswith(words)
    assert "vllm/model_executor/layers/linear.py:1066-1071" in problem


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp"),
    [(32, 8, 4), (32, 8, 8), (32, 2, 8), (32, 1, 4), (40, 8, 1), (None, 4, 2)],
)
def test_even_splits_and_even_replicas_are_accepted(
    heads: int | None, kv_heads: int, tp: int
) -> None:
    assert tensor_parallel_problem(gqa(heads, kv_heads), tp) is None


def test_mla_checks_the_attention_heads_only() -> None:
    model = catalog_model("deepseek-v2-lite")  # MLA: one latent every GPU keeps whole
    assert model.shape.is_mla
    heads = model.attention_heads
    assert heads is not None
    assert accepted_sizes(model) == [n for n in range(1, 9) if heads % n == 0]


def test_a_backend_on_3_gpus_of_a_32_head_model_is_a_config_error(tmp_path: Path) -> None:
    text = PINNED + "    model_info: {catalog: qwen3-8b}\n    gpus: auto\n"
    (found,) = problems(tmp_path, text + "    tensor_parallel_size: 3\n", hf=None)
    assert found == (
        f"{tmp_path / 'models.yaml'}: backends.reasoning: tensor parallel size 3: vLLM "
        "refuses it for catalog qwen3-8b: "
        "Total number of attention heads (32) must be divisible by tensor parallel size (3). "
        "(vllm/config/model.py:1557-1564, ModelConfig.verify_with_parallel_config); "
        "sizes it accepts up to 8: 1, 2, 4, 8"
    )
    counted = PINNED + "    model_info: {catalog: qwen3-8b}\n    gpus: [0, 1, 2]\n"
    assert "must be divisible by tensor parallel size (3)" in problems(tmp_path, counted)[0]
    fine = load(tmp_path, text + "    tensor_parallel_size: 4\n").backends["reasoning"]
    assert fine.gpu_count == 4


def test_an_hf_config_whose_kv_heads_do_not_split_is_a_config_error(tmp_path: Path) -> None:
    hf = {**R1_CONFIG, "num_attention_heads": 48, "head_dim": 128}  # 48 heads, 8 KV heads
    model_from_hf_config(hf)  # usable as such
    text = PINNED + "    hf_config: models/r1\n    model_info: {params_b: 14}\n    gpus: 3\n"
    (found,) = problems(tmp_path, text, hf=hf)
    assert "tensor parallel size 3: vLLM refuses it for hf_config " in found
    assert "8 is not divisible by 3" in found

"""`model_info:` and `hf_config:` on backends in models.yaml: accepted shapes, errors, lazy rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.planner.description import resolve
from app.settings import BackendConfig, ConfigError, Settings, load_settings

PINNED = """\
gpu: {probe: none}
backends:
  reasoning:
    url: http://127.0.0.1:8176
    models: [r1]
    runtime: {kind: process, command: [vllm]}
"""
LAZY = PINNED + "    lifecycle: lazy\n"

R1_CONFIG = {
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "hidden_size": 5120,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MICROSCHEDULER_* variable of the machine overrides the test's files."""
    for name in list(os.environ):
        if name.startswith("MICROSCHEDULER_"):
            monkeypatch.delenv(name)


def write_config(tmp_path: Path, text: str, hf: dict[str, object] | None = R1_CONFIG) -> Path:
    (tmp_path / "models.yaml").write_text(text, encoding="utf-8")
    if hf is not None:
        folder = tmp_path / "models" / "r1"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    return tmp_path


def load(tmp_path: Path, text: str) -> Settings:
    return load_settings(write_config(tmp_path, text))


def problems(tmp_path: Path, text: str, hf: dict[str, object] | None = R1_CONFIG) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(write_config(tmp_path, text, hf))
    return info.value.problems


# ---------------------------------------------------------------- the lazy rule


def test_lazy_without_vram_mib_or_a_description_is_refused(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, LAZY)
    assert line == (
        f"{tmp_path / 'models.yaml'}: backends.reasoning: vram_mib: is required for "
        "lifecycle: lazy (used for admission), unless model_info: or hf_config: describes "
        "the model to plan it from"
    )


def test_lazy_with_a_catalog_description_needs_no_vram_mib(tmp_path: Path) -> None:
    text = LAZY + "    model_info: {catalog: DeepSeek-AI/DeepSeek-R1-Distill-Qwen-14B}\n"
    backend = load(tmp_path, text).backends["reasoning"]
    assert backend.vram_mib is None
    assert backend.model_info is not None
    assert backend.model_info.catalog == "deepseek-r1-distill-qwen-14b"


def test_lazy_with_hf_config_relative_to_the_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative to the config directory, not the working dir
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    text = LAZY + "    hf_config: models/r1\n    model_info: {params_b: 14.8, weights_dtype: awq}\n"
    backend = load(config_dir, text).backends["reasoning"]
    assert backend.hf_config is not None
    assert backend.hf_config.path == config_dir / "models" / "r1" / "config.json"
    assert backend.hf_config.model.shape.head_dim == 128  # 5120 / 40
    planned = resolve(backend.model_info, backend.hf_config)
    assert planned is not None
    assert planned.max_model_len == 8192  # the default
    assert planned.max_num_seqs is None  # not configured: vLLM's default, not passed
    assert planned.kv_dtype.name == "bf16"  # auto: the model's torch_dtype
    assert planned.cuda_graphs is True


def test_a_loaded_backend_validates_again_from_its_dump_without_the_file(
    tmp_path: Path,
) -> None:
    text = LAZY + "    hf_config: models/r1\n    model_info: {params_b: 14.8}\n"
    backend = load(tmp_path, text).backends["reasoning"]
    (tmp_path / "models" / "r1" / "config.json").unlink()
    again = BackendConfig.model_validate(backend.model_dump(by_alias=True))
    assert again == backend


def test_shape_fields_describe_a_model(tmp_path: Path) -> None:
    text = LAZY + (
        "    model_info:\n"
        "      layers: 61\n"
        "      kv_lora_rank: 512\n"
        "      rope_head_dim: 64\n"
        "      weights_gib: 20\n"
        "      kv_dtype: fp8\n"
        "      max_model_len: 32768\n"
        "      max_num_seqs: 2\n"
    )
    backend = load(tmp_path, text).backends["reasoning"]
    planned = resolve(backend.model_info, backend.hf_config)
    assert planned is not None
    assert planned.model.shape.is_mla
    assert planned.kv_bytes_per_token == 61 * (512 + 64)  # fp8: one byte per element
    # max_num_seqs 2 does not multiply it: one request of 32,768 tokens (2,048 blocks) + the
    # null block.
    assert planned.max_num_seqs == 2
    assert planned.kv_budget_bytes == 61 * 576 * (2048 + 1) * 16
    assert planned.weight_bytes == 20 * 2**30


def test_the_default_context_is_clamped_to_the_models_limit(tmp_path: Path) -> None:
    text = PINNED + "    hf_config: models/r1\n    model_info: {params_b: 7}\n"
    config = write_config(tmp_path, text, {**R1_CONFIG, "max_position_embeddings": 4096})
    backend = load_settings(config).backends["reasoning"]
    planned = resolve(backend.model_info, backend.hf_config)
    assert planned is not None
    assert planned.max_model_len == 4096


# ---------------------------------------------------------------- errors name the key


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "    hf_config: models/missing.json\n    model_info: {params_b: 14}\n",
            "backends.reasoning.hf_config: file not found: {dir}/models/missing.json",
        ),
        (
            "    hf_config: models/r1\n",
            "backends.reasoning: model_info.params_b: is required to size the weights",
        ),
        (
            "    hf_config: models/r1\n    model_info: {catalog: qwen3-8b}\n",
            "backends.reasoning: model_info: give catalog or hf_config, not both",
        ),
        (
            "    hf_config: models/r1\n    model_info: {layers: 4, params_b: 1}\n",
            "backends.reasoning: model_info: give the shape fields or hf_config, not both",
        ),
        (
            "    model_info: {catalog: nope}\n",
            "backends.reasoning.model_info.catalog: unknown model 'nope'",
        ),
        (
            "    model_info: {catalog: qwen3-8b, layer: 3}\n",
            "backends.reasoning.model_info.layer: unknown key",
        ),
        (
            "    model_info: {catalog: qwen3-8b, kv_dtype: fp7}\n",
            "backends.reasoning.model_info.kv_dtype: unknown KV dtype 'fp7'",
        ),
        (
            "    model_info: {catalog: qwen3-8b, weights_dtype: int3}\n",
            "backends.reasoning.model_info.weights_dtype: unknown weight dtype 'int3'",
        ),
        (
            "    model_info: {catalog: qwen3-8b, layers: 36}\n",
            "backends.reasoning.model_info: give catalog or the shape fields",
        ),
        (
            "    model_info: {catalog: qwen3-8b, params_b: 8, weights_gib: 5}\n",
            "backends.reasoning.model_info: give params_b or weights_gib, not both",
        ),
        (
            "    model_info: {layers: 32, kv_heads: 8, params_b: 8}\n",
            "backends.reasoning: model_info: standard attention needs kv_heads and head_dim",
        ),
        (
            "    model_info: {kv_heads: 8, head_dim: 128, params_b: 8}\n",
            "backends.reasoning: model_info.layers: is required with the shape fields",
        ),
        (
            "    model_info: {max_model_len: 4096}\n",
            "backends.reasoning: model_info: describe the model with catalog: NAME",
        ),
        (
            "    model_info: {catalog: qwen3-8b, max_model_len: 65536}\n",
            "backends.reasoning: model_info.max_model_len: 65536 is more than the model's "
            "limit of 40960 tokens",
        ),
        (
            "    model_info: {catalog: deepseek-v3, kv_dtype: tq3k4v}\n",
            "backends.reasoning: model_info.kv_dtype: KV dtype 'tq3k4v' has separate key/value",
        ),
        (
            "    model_info: {catalog: qwen3-8b, gpu_memory_utilization: 1.5}\n",
            "backends.reasoning.model_info.gpu_memory_utilization: Input should be less than "
            "or equal to 1",
        ),
        (
            "    model_info: {catalog: qwen3-8b, max_num_seqs: 0}\n",
            "backends.reasoning.model_info.max_num_seqs: Input should be greater than 0",
        ),
    ],
)
def test_description_errors_name_file_and_key(tmp_path: Path, extra: str, expected: str) -> None:
    found = problems(tmp_path, LAZY + extra)
    prefix = f"{tmp_path / 'models.yaml'}: {expected.format(dir=tmp_path)}"
    assert any(line.startswith(prefix) for line in found), found


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must contain a JSON object"),
        ("{}", "config.json has no num_hidden_layers"),
    ],
)
def test_unusable_hf_config_files_are_named(tmp_path: Path, content: str, expected: str) -> None:
    folder = tmp_path / "models" / "r1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(content, encoding="utf-8")
    text = PINNED + "    hf_config: models/r1\n    model_info: {params_b: 14}\n"
    (line,) = problems(tmp_path, text, hf=None)
    assert line.startswith(f"{tmp_path / 'models.yaml'}: backends.reasoning.hf_config: ")
    assert expected in line

"""`microscheduler plan backend NAME`: a configured backend's footprint on each of its GPUs
(weights / TP + KV + graphs + overhead + context), where it goes, and vLLM's refusal of a
tensor-parallel size (issue 37, item 2); `plan profile` says a backend with `gpus: auto`
is placed at each start."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli.test_plan_cli import run, run_json
from tests.unit.planner.test_model_description import clean_env  # noqa: F401 (autouse)

MODELS = """\
gpu: {probe: sim, sim: {total_mib: 24576, count: 2}, placement: spread}
backends:
  small:
    url: http://127.0.0.1:8301
    models: [qwen3-8b]
    runtime: {kind: process, command: [vllm, serve]}
    lifecycle: lazy
    gpus: auto
    model_info: {catalog: qwen3-8b}
  pair:
    url: http://127.0.0.1:8302
    models: [llama-pair]
    runtime: {kind: process, command: [vllm, serve]}
    lifecycle: lazy
    gpus: auto
    tensor_parallel_size: 2
    model_info: {catalog: llama-3.1-8b}
  fixed:
    url: http://127.0.0.1:8303
    models: [llama]
    runtime: {kind: process, command: [vllm, serve]}
    gpus: [1]
    model_info: {catalog: llama-3.1-8b}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "models.yaml").write_text(MODELS, encoding="utf-8")
    return tmp_path


def test_a_tp_2_backend_holds_half_the_weights_on_each_gpu_and_is_placed_at_each_start(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = run_json(["plan", "backend", "pair", "--config", str(config)], capsys)
    alone = run_json(["plan", "backend", "fixed", "--config", str(config)], capsys)
    assert (pair["tensor_parallel_size"], alone["tensor_parallel_size"]) == (2, 1)
    assert pair["weights_gib_per_gpu"] == pytest.approx(alone["weights_gib_per_gpu"] / 2, 1e-3)
    # 8 KV heads split over 2 GPUs: the least KV cache per GPU halves too.
    assert pair["kv_budget_gib_per_gpu"] == pytest.approx(alone["kv_budget_gib_per_gpu"] / 2, 1e-2)
    assert pair["per_gpu_mib"] < alone["per_gpu_mib"]
    assert pair["gpu_total_mib"] == 24576
    assert pair["placed"] == (
        f"gpus: auto: placed at each start on 2 GPUs of host local with "
        f"{pair['per_gpu_mib']:,} MiB free on each (or room made by the usual eviction), by "
        "its gpu.placement: spread"
    )
    assert alone["placed"] == "gpus: [1]: always on GPU 1 of host local"

    code, out, _ = run(["plan", "backend", "pair", "--config", str(config)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "backend pair: catalog llama-3.1-8b, tensor parallel 2"
    assert lines[1] == "on each of its 2 GPUs of 24,576 MiB (gpu.sim.total_mib):"
    assert [line.split()[0] for line in lines[2:8]] == [
        "weights", "KV", "CUDA", "overhead", "CUDA", "per"
    ]  # fmt: skip
    assert "x 1.02 / 2" in lines[2]
    assert "--tensor-parallel-size 2 " in out
    assert "placement: gpus: auto: placed at each start on 2 GPUs" in out


def test_tensor_parallel_size_3_of_a_32_head_model_is_refused(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "backend", "small", "--config", str(config), "--tensor-parallel-size", "3"]
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert out.splitlines() == [
        "backend small: catalog qwen3-8b, tensor parallel 3 (configured: 1)",
        "refused: tensor parallel size 3: vLLM refuses it for catalog qwen3-8b: Total number "
        "of attention heads (32) must be divisible by tensor parallel size (3). "
        "(vllm/config/model.py:1557-1564, ModelConfig.verify_with_parallel_config); sizes it "
        "accepts up to 8: 1, 2, 4, 8",
    ]
    what_if = run_json([*argv[:-2], "--gpus", "4"], capsys)
    assert (what_if["tensor_parallel_size"], what_if["refused"]) == (4, None)


def test_plan_profile_says_an_auto_backend_is_placed_at_each_start(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(["plan", "profile", "--config", str(config), "--gpu-gib", "24"], capsys)
    notes = [line.strip() for line in out.splitlines() if "placed at each start" in line]
    assert notes[:2] == [
        "note: gpus: auto: placed at each start on 1 GPU of host local by its "
        "gpu.placement: spread; planned here on GPU 0",
        "note: gpus: auto: placed at each start on 2 GPUs of host local by its "
        "gpu.placement: spread; planned here on GPU 0, 1",
    ]
    assert not [line for line in out.splitlines() if line.startswith("fixed") and "note" in line]

"""`microscheduler plan profile`: a GPU profile against the GPU, from a config directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli.test_plan_cli import run, run_json
from tests.unit.planner.test_model_description import R1_CONFIG, clean_env  # noqa: F401 (autouse)

MODELS = """\
gpu: {probe: none}
backends:
  orchestrator:
    url: http://vllm-orchestrator:8000
    models: [nemotron-8b]
    runtime: {kind: docker, container: vllm-orchestrator}
    model_info:
      catalog: qwen3-8b
      weights_dtype: awq
      kv_dtype: fp8
      max_model_len: 16384
      max_num_seqs: 4
  reasoning:
    url: http://vllm-reasoning:8000
    models: [deepseek-r1-distill-qwen-14b]
    runtime: {kind: docker, container: vllm-reasoning}
    lifecycle: lazy
    hf_config: models/r1
    model_info:
      repo: casperhansen/deepseek-r1-distill-qwen-14b-awq
      params_b: 14.8
      weights_dtype: awq
      kv_dtype: tq-t4nc
      max_model_len: 8192
      max_num_seqs: 4
  embeddings:
    url: http://vllm-embeddings:8000
    models: [bge-m3]
    runtime: {kind: docker, container: vllm-embeddings}
    lifecycle: lazy
    vram_mib: 3100
  creative:
    url: http://comfyui:8188
    models: [flux]
    runtime: {kind: docker, container: comfyui}
    lifecycle: lazy
    vram_mib: 12000
"""

PROFILES = """\
profiles:
  dev:
    gpu_total_gb: 32
    target_utilization_pct: 95
    models:
      orchestrator: {vram_pct: 40, cuda_graphs: true}
      reasoning: {cuda_graphs: false, sleep_mode: true}
      creative: {enabled: false}
  production:
    gpu_total_gb: 32
    target_utilization_pct: 92
    models:
      orchestrator: {vram_pct: 85}
      creative: {enabled: false}
  bare:
    models:
      creative: {enabled: false}
      embeddings: {enabled: false}
active: dev
"""


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "models.yaml").write_text(MODELS, encoding="utf-8")
    (tmp_path / "gpu_profiles.yaml").write_text(PROFILES, encoding="utf-8")
    folder = tmp_path / "models" / "r1"
    folder.mkdir(parents=True)
    r1 = {**R1_CONFIG, "vocab_size": 152064}  # untied embeddings stay 16-bit in AWQ
    (folder / "config.json").write_text(json.dumps(r1), encoding="utf-8")
    return tmp_path


def by_backend(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["backend"]: item for item in data["instances"]}


def test_the_active_profile_fits_and_each_instance_has_its_command(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_json(["plan", "profile", "--config", str(config_dir)], capsys)
    assert data["profile"] == "dev"
    assert data["active"] is True
    assert data["gpu_total_gib"] == 32.0
    assert data["fits"] is True
    assert data["complete"] is True
    assert data["problems"] == []
    assert [item["backend"] for item in data["instances"]] == ["orchestrator", "reasoning"]
    assert data["disabled"] == ["creative"]
    # No description: its vram_mib is counted as in use before the others start.
    assert data["not_planned"] == [
        {
            "backend": "embeddings",
            "missing": "no model description: add model_info: or hf_config: to "
            "backends.embeddings in models.yaml",
            "counted_mib": 3100,
            "counted_from": "vram_mib",
        }
    ]
    instances = by_backend(data)
    orchestrator = instances["orchestrator"]
    # vram_pct 40 pins --gpu-memory-utilization 0.40: 0.40 x 32 GiB = 12.8 GiB of budget, the
    # 0.8 GiB of CUDA graphs inside it (vLLM 0.33), + CUDA context 0.5 = 13.3 GiB.
    assert orchestrator["gpu_memory_utilization"] == 0.40
    assert orchestrator["expected_used_gib"] == 13.3
    assert orchestrator["ok"] is True
    assert orchestrator["argv"] == [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--served-model-name",
        "nemotron-8b",
        "--port",
        "8000",
        "--gpu-memory-utilization",
        "0.40",
        "--kv-cache-dtype",
        "fp8",
        "--max-model-len",
        "16384",
        "--max-num-seqs",
        "4",
    ]
    assert orchestrator["env"] == {}
    reasoning = instances["reasoning"]
    assert reasoning["ok"] is True
    assert reasoning["cuda_graphs"] is False  # the profile's cuda_graphs: false
    assert reasoning["sleep_mode"] is True
    assert reasoning["env"] == {"VLLM_SERVER_DEV_MODE": "1"}
    assert reasoning["command"].startswith(
        "VLLM_SERVER_DEV_MODE=1 vllm serve casperhansen/deepseek-r1-distill-qwen-14b-awq "
        "--served-model-name deepseek-r1-distill-qwen-14b --port 8000 --gpu-memory-utilization "
    )
    assert reasoning["command"].endswith(
        "--enforce-eager --kv-cache-dtype tq-t4nc --max-model-len 8192 --max-num-seqs 4 "
        "--enable-sleep-mode"
    )
    assert reasoning["kv_dtype"] == "tq4"
    # tq4: 48 x 8 x (68 + 68) = 52,224 bytes per token x one request of 8192 tokens (512
    # blocks of 16 + the null block); its max_num_seqs 4 does not multiply it.
    assert reasoning["kv_bytes_per_token"] == 52_224
    assert reasoning["kv_budget_gib"] == round(52_224 * 513 * 16 / 2**30, 3)
    assert reasoning["max_num_seqs"] == 4
    assert reasoning["max_concurrency"] == pytest.approx(
        reasoning["kv_cache_gib"] * 2**30 / (16 * 52_224) / 512, abs=0.01
    )
    (gpu,) = data["gpus"]
    assert gpu["fits"] is True
    assert gpu["held_by_undescribed_gib"] == round(3100 / 1024, 3)


def test_the_table_shows_the_commands_and_the_verdict(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plan", "profile", "--config", str(config_dir), "dev"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("profile dev (active): 32.00 GiB per GPU (the profile's gpu_total_gb)")
    assert (
        "  vllm serve Qwen/Qwen3-8B --served-model-name nemotron-8b --port 8000 "
        "--gpu-memory-utilization 0.40 --kv-cache-dtype fp8 --max-model-len 16384 "
        "--max-num-seqs 4\n"
    ) in out
    assert "not planned: embeddings: no model description" in out
    assert "3100 MiB (vram_mib) counted as in use before the others start" in out
    assert "disabled by the profile: creative" in out
    assert out.rstrip().endswith("fits: yes")


def test_a_profile_that_does_not_fit_says_why(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "profile", "--config", str(config_dir), "production"]
    data = run_json(argv, capsys, code=1)
    assert data["active"] is False
    assert data["fits"] is False
    reasoning = by_backend(data)["reasoning"]
    assert reasoning["ok"] is False
    assert reasoning["runs"] is False
    # 85% of 32 GiB for the orchestrator (+ its context and graphs) and 3100 MiB held by the
    # embeddings leave less than the reasoning instance's weights.
    assert data["problems"][0].startswith("reasoning: it needs ")
    assert data["problems"][0].endswith(" GiB short)")
    assert reasoning["advice"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (1, "")  # the plan is printed, and it does not fit
    assert "fits: NO\n  why: reasoning: it needs " in out


def test_above_the_target_utilization_does_not_fit(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profiles = PROFILES.replace("target_utilization_pct: 95", "target_utilization_pct: 60")
    (config_dir / "gpu_profiles.yaml").write_text(profiles, encoding="utf-8")
    data = run_json(["plan", "profile", "--config", str(config_dir)], capsys, code=1)
    assert data["fits"] is False
    assert all(item["ok"] for item in data["instances"])
    (problem,) = data["problems"]
    assert problem.startswith("together they use ")
    # It says what sits outside the vram_pct shares (here 3100 MiB of embeddings too).
    assert "of the 32.00 GiB GPU, more than the profile's target_utilization_pct 60%: " in problem
    assert "3.03 GiB held by backends without a model description" in problem


ALONE = """profiles:
  solo:
    gpu_total_gb: 32
    target_utilization_pct: 92
    models:
      orchestrator: {vram_pct: VRAM}
      reasoning: {enabled: false}
      embeddings: {enabled: false}
      creative: {enabled: false}
"""


def test_vram_pct_equal_to_the_target_says_what_sits_outside_and_what_fits(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # vram_pct 92 = target 92: the instance holds 0.92 x 32 GiB plus its 0.5 GiB CUDA context,
    # which vLLM creates before the snapshot its share is measured against: 29.94 GiB, 93.6%.
    # 93.5625 - 92 = 1.5625 points too many: the largest vram_pct is 92 - 1.5625 -> 90.4.
    (config_dir / "gpu_profiles.yaml").write_text(ALONE.replace("VRAM", "92"), encoding="utf-8")
    argv = ["plan", "profile", "--config", str(config_dir)]
    data = run_json(argv, capsys, code=1)
    (problem,) = data["problems"]
    assert problem == (
        "together they use 29.94 GiB, 93.6% of the 32.00 GiB GPU, more than the profile's "
        "target_utilization_pct 92%: their --gpu-memory-utilization shares add up to 92.0% "
        "(29.44 GiB) and 0.50 GiB (1.6%) sits outside the shares: the CUDA context of each "
        "instance (orchestrator 0.50 GiB), which vLLM creates before the start-up snapshot its "
        "--gpu-memory-utilization share is measured against (vllm/v1/worker/gpu_worker.py). "
        "The largest vram_pct for orchestrator within the target is 90.4 (its KV cache "
        f"{data['instances'][0]['kv_cache_gib'] - 0.016 * 32:.2f} GiB); or raise "
        "target_utilization_pct to at least 93.6"
    )
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert "fits: NO\n  why: together they use 29.94 GiB" in out
    # The advice holds: 90.4 fits, and so does the target it names.
    (config_dir / "gpu_profiles.yaml").write_text(ALONE.replace("VRAM", "90.4"), encoding="utf-8")
    assert run_json(argv, capsys)["fits"] is True
    raised = ALONE.replace("VRAM", "92").replace(
        "target_utilization_pct: 92", "target_utilization_pct: 93.6"
    )
    (config_dir / "gpu_profiles.yaml").write_text(raised, encoding="utf-8")
    assert run_json(argv, capsys)["fits"] is True


def test_a_backend_without_description_or_size_is_listed_as_not_counted(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = (
        "  tts:\n    url: http://tts:8000\n    models: [kokoro]\n"
        "    runtime: {kind: docker, container: tts}\n"
    )
    (config_dir / "models.yaml").write_text(MODELS + extra, encoding="utf-8")
    data = run_json(["plan", "profile", "--config", str(config_dir)], capsys)
    assert data["complete"] is False
    tts = next(item for item in data["not_planned"] if item["backend"] == "tts")
    assert tts["counted_mib"] is None
    assert "backends.tts" in tts["missing"]
    code, out, _ = run(["plan", "profile", "--config", str(config_dir)], capsys)
    assert code == 0
    assert "not planned: tts: no model description" in out
    assert "its memory is NOT counted" in out
    assert out.rstrip().endswith("fits: yes, for the memory that is known")


def test_gpu_gib_gives_the_gpu_a_profile_does_not_name(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_json(
        ["plan", "profile", "--config", str(config_dir), "bare", "--gpu-gib", "48"], capsys
    )
    assert data["gpu_total_gib"] == 48.0
    assert data["gpu_total_source"] == "--gpu-gib"
    assert data["disabled"] == ["embeddings", "creative"]
    assert data["not_planned"] == []
    assert data["fits"] is True


def assert_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    (line,) = err.splitlines()
    assert line.startswith("error: plan profile: ")
    assert fragment in line


def test_bad_input_is_one_error_line(config_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "profile", "--config", str(config_dir)]
    assert_bad_input([*base, "nope"], capsys, "unknown profile 'nope' (profiles: dev, ")
    assert_bad_input([*base, "bare"], capsys, "has no gpu_total_gb; give the GPU's memory")
    assert_bad_input([*base, "--gpu-gib", "0"], capsys, "--gpu-gib must be a positive number")
    (config_dir / "gpu_profiles.yaml").unlink()
    # Without gpu_profiles.yaml every backend is planned, on the GPU --gpu-gib gives.
    assert_bad_input(base, capsys, "gpu_profiles.yaml; give the GPU's memory with --gpu-gib")


def test_an_invalid_configuration_lists_every_problem_and_exits_1(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The one convention of every subcommand (app.cli.common): like check-config.
    (config_dir / "models" / "r1" / "config.json").unlink()
    code, out, err = run(["plan", "profile", "--config", str(config_dir)], capsys)
    assert (code, out) == (1, "")
    first, *problems = err.splitlines()
    assert first == "microscheduler: invalid configuration:"
    assert problems
    assert all(line.startswith("  ") for line in problems)
    assert problems[0].startswith(f"  {config_dir / 'models.yaml'}: backends.reasoning")


def test_the_shipped_configuration_fits_as_its_comments_say(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = Path(__file__).resolve().parents[3] / "config"
    data = run_json(["plan", "profile", "--config", str(config)], capsys)
    assert data["fits"] is True, data["problems"]
    assert data["not_planned"] == []
    commands = [item["command"] for item in data["instances"]]
    assert len(commands) == 3
    assert all("vllm serve" in command for command in commands)


@pytest.fixture
def models_only(config_dir: Path) -> Path:
    (config_dir / "gpu_profiles.yaml").unlink()
    return config_dir


def test_without_gpu_profiles_every_backend_is_one_profile(
    models_only: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "profile", "--config", str(models_only), "--gpu-gib", "48"]
    data = run_json(argv, capsys)
    assert (data["implicit"], data["profile"], data["gpu_total_source"]) == (
        True,
        None,
        "--gpu-gib",
    )
    assert data["gpu_total_gib"] == 48.0
    assert data["disabled"] == []
    # Pinned first (the orchestrator), then the lazy ones; no vram_pct: the planner chooses.
    assert [item["backend"] for item in data["instances"]] == ["orchestrator", "reasoning"]
    assert all(item["vram_pct"] is None for item in data["instances"])
    assert [item["backend"] for item in data["not_planned"]] == ["embeddings", "creative"]
    (gpu,) = data["gpus"]
    assert gpu["held_by_undescribed_gib"] == round((3100 + 12000) / 1024, 3)
    assert data["fits"] is True
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.startswith(
        "no gpu_profiles.yaml: every backend of models.yaml planned as one profile, "
        "48.00 GiB per GPU (--gpu-gib), no target below the whole GPU\n"
    )


def test_without_gpu_profiles_the_gpu_must_be_given(
    models_only: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "profile", "--config", str(models_only)]
    assert_bad_input(
        base,
        capsys,
        f"there is no {models_only / 'gpu_profiles.yaml'}; give the GPU's memory with --gpu-gib",
    )
    assert_bad_input([*base, "dev", "--gpu-gib", "48"], capsys, "profile 'dev': there is no ")


def test_a_lower_vram_pct_that_would_starve_the_kv_cache_is_not_offered(
    config_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Qwen3-8B AWQ: weights 5.80 + overhead 1 + graphs 0.8 GiB; one request of 16,384 fp8
    # tokens is 1.15 GiB of KV. At 27.5% of 32 GiB (8.8 GiB) the KV cache gets ~1.2 GiB; the
    # 0.5 GiB CUDA context puts it 1.5625 points over a 27.5% target, and 25.9% would leave
    # the KV cache below one request: only a higher target fits.
    profiles = ALONE.replace("VRAM", "27.5").replace(
        "target_utilization_pct: 92", "target_utilization_pct: 27.5"
    )
    (config_dir / "gpu_profiles.yaml").write_text(profiles, encoding="utf-8")
    data = run_json(["plan", "profile", "--config", str(config_dir)], capsys, code=1)
    (problem,) = data["problems"]
    assert (
        ". Lowering orchestrator's vram_pct to 25.9 would fit the target but leave its KV cache "
        "short of one request of max_model_len tokens; or raise target_utilization_pct to at "
        "least 29.1"
    ) in problem

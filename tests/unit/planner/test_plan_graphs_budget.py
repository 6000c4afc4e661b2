"""CUDA graphs inside `--gpu-memory-utilization` (vLLM >= 0.21) by default, on top on request.

vLLM 0.33, `Worker.determine_available_memory` (vllm/v1/worker/gpu_worker.py):

    available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory
                                      - cudagraph_memory_estimate_applied

where the estimate is applied while `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` is 1, its default
in vllm/envs.py ("Enabled by default as of v0.21.0"). The planner's names: KV = U x T - W - O - G,
and the instance holds C + U x T.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.cli.test_plan_cli import run_json
from tests.unit.planner.test_model_description import clean_env  # noqa: F401 (autouse)

ROOT = Path(__file__).resolve().parents[3]

# The `plan share` example of docs/planner.md.
ORCHESTRATOR = "name=orchestrator,weights-gib=6.4,kv-gib=1.6,graphs-gib=0.8,overhead-gib=4.7"
REASONING = "name=reasoning,weights-gib=9.4,kv-gib=1,eager"
SHARE = ["plan", "share", "--gpu-gib", "31.84", "--instance", ORCHESTRATOR]


def test_the_readme_example_takes_the_graphs_from_the_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # orchestrator: U x 31.84 >= 6.4 + 4.7 + 1.6 + 0.8 = 13.5 -> U >= 0.42399 -> 0.43;
    #   budget 0.43 x 31.84 = 13.6912, KV = 13.6912 - 6.4 - 4.7 - 0.8 = 1.7912 GiB;
    #   holds 0.5 + 13.6912 = 14.1912 GiB, leaves 31.84 - 14.1912 = 17.6488.
    # reasoning (eager, no graphs): U x 31.84 >= 9.4 + 1 + 1 = 11.4 -> 0.36 -> 11.4624;
    #   holds 0.5 + 11.4624 = 11.9624, leaves 17.6488 - 11.9624 = 5.6864 GiB.
    data = run_json([*SHARE, "--instance", REASONING], capsys)
    first, second = data["instances"]
    assert first["flags"] == ["--gpu-memory-utilization", "0.43"]
    assert first["kv_cache_gib"] == pytest.approx(1.791, abs=0.001)
    assert first["expected_used_gib"] == pytest.approx(14.191, abs=0.001)
    assert first["notes"] == []
    assert second["flags"] == ["--gpu-memory-utilization", "0.36", "--enforce-eager"]
    assert data["free_gib"] == pytest.approx(5.686, abs=0.001)
    assert data["fits"] is True


def test_graphs_in_budget_is_still_accepted_and_is_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_json([*SHARE, "--graphs-in-budget"], capsys) == run_json(SHARE, capsys)


def test_graphs_outside_budget_restores_the_old_accounting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # U x 31.84 >= 6.4 + 4.7 + 1.6 = 12.7 -> 0.3989 -> 0.40: 12.736, KV = 12.736 - 11.1 = 1.636;
    # holds 0.5 + 12.736 + 0.8 (graphs on top) = 14.036 GiB.
    for argv in (
        [*SHARE, "--graphs-outside-budget"],
        [
            "plan",
            "share",
            "--gpu-gib",
            "31.84",
            "--instance",
            ORCHESTRATOR + ",graphs-outside-budget",
        ],
    ):
        (item,) = run_json(argv, capsys)["instances"]
        assert item["flags"] == ["--gpu-memory-utilization", "0.40"]
        assert item["kv_cache_gib"] == pytest.approx(1.636, abs=0.001)
        assert item["expected_used_gib"] == pytest.approx(14.036, abs=0.001)
        assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in item["notes"][0]


MODELS = """\
gpu: {probe: none}
backends:
  current:
    url: http://vllm-a:8000
    models: [a]
    runtime: {kind: docker, container: vllm-a}
    model_info: {catalog: qwen3-8b, weights_dtype: awq, kv_dtype: fp8, max_model_len: 8192}
  old:
    url: http://vllm-b:8001
    models: [b]
    runtime: {kind: docker, container: vllm-b}
    lifecycle: lazy
    model_info:
      catalog: qwen3-8b
      weights_dtype: awq
      kv_dtype: fp8
      max_model_len: 8192
      graphs_outside_budget: true
"""

PROFILES = """\
profiles:
  dev:
    gpu_total_gb: 48
    target_utilization_pct: 95
    models:
      current: {vram_pct: 30}
      old: {vram_pct: 30}
active: dev
"""


def test_plan_profile_prints_the_variable_that_keeps_graphs_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models.yaml").write_text(MODELS, encoding="utf-8")
    (tmp_path / "gpu_profiles.yaml").write_text(PROFILES, encoding="utf-8")
    data = run_json(["plan", "profile", "--config", str(tmp_path)], capsys)
    current, old = data["instances"]
    # Both pinned at 0.30 x 48 GiB = 14.4 GiB of budget, 0.5 GiB of CUDA context, 0.8 of graphs.
    assert (current["graphs_in_budget"], old["graphs_in_budget"]) == (True, False)
    assert current["env"] == {}
    assert current["expected_used_gib"] == pytest.approx(0.5 + 14.4)
    assert old["env"] == {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}
    assert old["command"].startswith("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 vllm serve ")
    assert old["expected_used_gib"] == pytest.approx(0.5 + 14.4 + 0.8)
    # The graphs come out of the current one's KV cache, not the old one's.
    assert old["kv_cache_gib"] - current["kv_cache_gib"] == pytest.approx(0.8, abs=0.001)


def _compose_utilizations() -> dict[str, str]:
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for service, body in re.findall(r"\n  (vllm-[a-z]+):\n(.*?)(?=\n  [a-z]|\Z)", text, re.S):
        match = re.search(r"--gpu-memory-utilization (\S+)", body)
        if match:
            found[service.removeprefix("vllm-")] = match.group(1)
    return found


def test_compose_starts_the_shipped_instances_with_the_planned_utilizations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(["plan", "profile", "--config", str(ROOT / "config")], capsys)
    planned = {item["backend"]: item["flags"][1] for item in data["instances"]}
    assert planned == _compose_utilizations()
    # The orchestrator keeps its whole KV budget with the 0.8 GiB of graphs in the budget:
    # U x 32 >= 5.80 (weights) + 1 (overhead) + 0.8 (graphs) + 3.375 (KV) -> 0.35.
    orchestrator = next(item for item in data["instances"] if item["backend"] == "orchestrator")
    assert orchestrator["ok"] is True
    assert orchestrator["gpu_memory_utilization"] == 0.35
    assert orchestrator["kv_cache_gib"] >= orchestrator["kv_budget_gib"]

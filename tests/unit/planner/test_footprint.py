"""Planned VRAM footprints: precedence (vram_mib, profile, planner), numbers checked by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.api.views import footprint_view
from app.planner.description import resolve
from app.planner.footprint import Footprint, backend_instance, planned_footprint_mib
from app.planner.units import MIB
from app.settings import BackendConfig, load_settings
from tests.unit.planner.test_model_description import R1_CONFIG, clean_env  # noqa: F401 (autouse)

# A 14B model in bf16: 48 layers, 8 KV heads, head_dim 128, 8192 tokens; max_num_seqs 4 is
# passed to vLLM but does not size the KV cache (vLLM never reserves context x max_num_seqs).
FOURTEEN_B = {
    "layers": 48,
    "kv_heads": 8,
    "head_dim": 128,
    "params_b": 14,
    "weights_dtype": "bf16",
    "max_model_len": 8192,
    "max_num_seqs": 4,
}
# By hand (MiB = 2**20 bytes):
#   weights   14e9 x 2 bytes x 1.02           = 28,560,000,000 B = 27,236.938 MiB
#   KV        2 x 48 x 8 x 128 x 2 = 196,608 B/token; a 16-token block = 3 MiB. vLLM's least
#             KV cache is one request of 8192 tokens (512 blocks) + the null block:
#             513 x 3 = 1,539 MiB (check_enough_kv_cache_memory, kv_cache_planning.py)
#   overhead  1 GiB = 1,024 MiB; CUDA context 0.5 GiB = 512 MiB; CUDA graphs 0.8 GiB = 819.2 MiB
# No GPU total: the parts with exactly the KV budget:
#   512 + 27,236.938 + 1,024 + 819.2 + 1,539 = 31,131.138 -> 31,132 MiB
# On a 48 GiB GPU (49,152 MiB), vLLM 0.33 (graphs inside the budget: KV = U x T - W - O - G,
# Worker.determine_available_memory in vllm/v1/worker/gpu_worker.py): the budget must hold
# weights + overhead + CUDA graphs + KV:
#   27,236.938 + 1,024 + 819.2 + 1,539 = 30,619.138 MiB = 0.62295 x 49,152 -> U = 0.63
#   0.63 x 49,152 = 30,965.76 MiB, KV gets 30,965.76 - 27,236.938 - 1,024 - 819.2 = 1,885.62 MiB
#   = 628 whole blocks / 512 per request: maximum concurrency 1.23 (vLLM's log figure)
#   used = CUDA context 512 + 30,965.76 = 31,477.76 -> 31,478
# With model_info.graphs_outside_budget (vLLM < 0.21, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0):
#   27,236.938 + 1,024 + 1,539 = 29,799.938 MiB = 0.60628 x 49,152 -> U = 0.61 (0.01 steps)
#   0.61 x 49,152 = 29,982.72 MiB, KV gets 29,982.72 - 27,236.938 - 1,024 = 1,721.78 MiB
#   used = CUDA context 512 + 29,982.72 + graphs outside the budget 819.2 = 31,313.92 -> 31,314
WEIGHTS_MIB = 28_560_000_000 / MIB
NO_GPU_MIB = 31_132
ON_48_GIB_MIB = 31_478
OLD_ON_48_GIB_MIB = 31_314


def backend(**fields: Any) -> BackendConfig:
    data: dict[str, Any] = {"url": "http://127.0.0.1:8000", "models": ["m"], **fields}
    return BackendConfig.model_validate(data)


def test_the_14b_example_by_hand_without_a_gpu_total() -> None:
    footprint = planned_footprint_mib(backend(model_info=FOURTEEN_B), gpu_total_mib=None)
    assert footprint is not None
    assert (footprint.mib, footprint.source) == (NO_GPU_MIB, "planner")
    parts = footprint.parts
    assert parts is not None
    assert parts.weights_bytes == 28_560_000_000
    assert parts.kv_budget_bytes == parts.kv_cache_bytes == 1_539 * MIB
    assert parts.cuda_graphs_bytes == round(0.8 * 1024 * MIB)
    assert parts.overhead_bytes == 1024 * MIB
    assert parts.cuda_context_bytes == 512 * MIB
    assert parts.gpu_memory_utilization is None
    assert parts.fits_gpu is None


def test_the_14b_example_by_hand_on_a_48_gib_gpu() -> None:
    footprint = planned_footprint_mib(backend(model_info=FOURTEEN_B), gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.mib == ON_48_GIB_MIB
    parts = footprint.parts
    assert parts is not None
    assert parts.gpu_memory_utilization == 0.63
    assert parts.kv_cache_memory_bytes is None
    assert parts.kv_cache_bytes / MIB == pytest.approx(30_965.76 - WEIGHTS_MIB - 1024 - 819.2)
    assert parts.max_concurrency == pytest.approx(628 / 512)
    assert parts.graphs_in_budget is True
    assert parts.fits_gpu is True
    assert parts.problems == ()
    assert footprint_view(footprint) == {
        "mib": ON_48_GIB_MIB,
        "source": "planner",
        "weights_mib": 27_237,
        "kv_cache_mib": 1_886,
        "kv_budget_mib": 1_539,
        "cuda_graphs_mib": 819,
        "overhead_mib": 1_024,
        "cuda_context_mib": 512,
        "gpu_memory_utilization": 0.63,
        "kv_cache_memory_bytes": None,
        "fits_gpu": True,
        "problems": [],
        "max_concurrency": 1.23,
    }


def test_graphs_outside_budget_restores_the_old_accounting() -> None:
    old = backend(model_info={**FOURTEEN_B, "graphs_outside_budget": True})
    footprint = planned_footprint_mib(old, gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.mib == OLD_ON_48_GIB_MIB
    parts = footprint.parts
    assert parts is not None
    assert parts.gpu_memory_utilization == 0.61
    assert parts.kv_cache_bytes / MIB == pytest.approx(29_982.72 - WEIGHTS_MIB - 1024)
    assert parts.graphs_in_budget is False


def test_enforce_eager_drops_the_graphs() -> None:
    # As above without the 819.2 MiB of graphs: 512 + 29,982.72 = 30,494.72 -> 30,495.
    eager = backend(model_info={**FOURTEEN_B, "cuda_graphs": False})
    footprint = planned_footprint_mib(eager, gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.mib == 30_495
    # A profile's cuda_graphs wins over the description's.
    overridden = planned_footprint_mib(
        backend(model_info=FOURTEEN_B), gpu_total_mib=49_152, cuda_graphs=False
    )
    assert overridden == footprint


def test_tensor_parallel_splits_weights_and_kv() -> None:
    # 2 GPUs of 24 GiB: weights 27,236.938 / 2 = 13,618.47 MiB, KV 1,539 / 2 = 769.5 MiB (4 of
    # the 8 KV heads each: 1.5 MiB blocks). 13,618.47 + 1,024 + 819.2 (graphs) + 769.5
    # = 16,231.17 = 0.66045 x 24,576 -> U = 0.67 = 16,465.92 MiB; used = 512 + 16,465.92
    # = 16,977.92 -> 16,978 MiB on each GPU.
    footprint = planned_footprint_mib(
        backend(model_info=FOURTEEN_B, gpus=[0, 1]), gpu_total_mib=24_576
    )
    assert footprint is not None
    assert footprint.mib == 16_978
    assert footprint.parts is not None
    assert footprint.parts.gpu_memory_utilization == 0.67


def test_an_mla_latent_is_not_split_over_gpus() -> None:
    one = backend_instance(backend(model_info={"catalog": "deepseek-v2-lite"}))
    two = backend_instance(backend(model_info={"catalog": "deepseek-v2-lite"}, gpus=[0, 1]))
    assert one is not None
    assert two is not None
    assert two.kv_bytes == one.kv_bytes
    assert two.weight_bytes == pytest.approx(one.weight_bytes / 2, abs=1)


def test_an_instance_too_big_for_the_gpu_reports_its_need_and_why() -> None:
    footprint = planned_footprint_mib(backend(model_info=FOURTEEN_B), gpu_total_mib=30_720)
    assert footprint is not None
    assert footprint.mib == NO_GPU_MIB  # what it needs, whatever the GPU
    assert footprint.parts is not None
    assert footprint.parts.fits_gpu is False
    assert footprint.parts.problems


@pytest.mark.parametrize(
    ("fields", "profile_mib", "expected"),
    [
        ({"vram_mib": 16_900, "model_info": FOURTEEN_B}, 12_000, Footprint(16_900, "vram_mib")),
        ({"vram_mib": 16_900}, None, Footprint(16_900, "vram_mib")),
        ({"model_info": FOURTEEN_B}, 12_000, Footprint(12_000, "profile")),
        ({}, 12_000, Footprint(12_000, "profile")),
        ({}, None, None),
    ],
)
def test_precedence_vram_mib_then_profile_then_planner(
    fields: dict[str, Any], profile_mib: int | None, expected: Footprint | None
) -> None:
    found = planned_footprint_mib(
        backend(**fields), gpu_total_mib=49_152, profile_planned_mib=profile_mib
    )
    assert found == expected


def test_planner_is_last() -> None:
    found = planned_footprint_mib(backend(model_info=FOURTEEN_B), gpu_total_mib=49_152)
    assert found is not None
    assert (found.source, found.mib) == ("planner", ON_48_GIB_MIB)


def test_a_pinned_utilization_is_what_the_instance_takes() -> None:
    # U = 0.80 of 49,152 = 39,321.6 MiB, the graphs inside it (vLLM 0.33): + 512 = 39,833.6
    # -> 39,834. The old accounting counted the 819.2 MiB of graphs a second time: 40,653.
    pinned = backend(model_info={**FOURTEEN_B, "gpu_memory_utilization": 0.8})
    footprint = planned_footprint_mib(pinned, gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.mib == 39_834
    old = backend(
        model_info={**FOURTEEN_B, "gpu_memory_utilization": 0.8, "graphs_outside_budget": True}
    )
    old_footprint = planned_footprint_mib(old, gpu_total_mib=49_152)
    assert old_footprint is not None
    assert old_footprint.mib == 40_653


def test_hf_config_is_read_at_load_and_never_again(tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "fourteen"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(R1_CONFIG), encoding="utf-8")
    (tmp_path / "models.yaml").write_text(
        "gpu: {probe: none}\n"
        "backends:\n"
        "  reasoning:\n"
        "    url: http://127.0.0.1:8176\n"
        "    models: [r1]\n"
        "    runtime: {kind: process, command: [vllm]}\n"
        "    lifecycle: lazy\n"
        "    hf_config: models/fourteen\n"
        "    model_info: {params_b: 14, max_model_len: 8192, max_num_seqs: 4}\n",
        encoding="utf-8",
    )
    config_backend = load_settings(tmp_path).backends["reasoning"]
    (model_dir / "config.json").unlink()  # the footprint must not need the file any more
    footprint = planned_footprint_mib(config_backend, gpu_total_mib=49_152)
    assert footprint is not None
    # The same shape as FOURTEEN_B (5120 / 40 = head_dim 128): the same numbers.
    assert footprint.mib == ON_48_GIB_MIB
    planned = resolve(config_backend.model_info, config_backend.hf_config)
    assert planned is not None
    assert planned.source == f"hf_config {model_dir / 'config.json'}"

"""vLLM's KV rule in the planner: the cache gets what the budget leaves, vLLM refuses to start
only when that cannot hold one request of max_model_len tokens, and `max_num_seqs` neither
sizes the cache nor appears in the printed command unless configured.

vLLM 0.33: `check_enough_kv_cache_memory` (vllm/v1/core/kv_cache_planning.py:151), the
"Maximum concurrency for N tokens per request" log (vllm/v1/core/kv_cache_utils.py:1136).
"""

from __future__ import annotations

from typing import Any

import pytest

from app.planner.description import resolve
from app.planner.footprint import backend_instance, planned_footprint_mib
from app.planner.kv import max_concurrency, one_request_kv_bytes
from app.planner.profile_plan import vllm_command
from app.planner.share import ShareRequest, plan_share
from app.planner.units import MIB
from tests.unit.planner.test_footprint import FOURTEEN_B, backend

# FOURTEEN_B: 196,608 bytes per token, so a 16-token block is 3 MiB; 8192 tokens = 512 blocks.
BLOCK_MIB = 3
# On a 48 GiB GPU (49,152 MiB) the budget U x T pays weights 27,236.938 + overhead 1,024 +
# CUDA graphs 819.2 = 29,080.138 MiB before the KV cache.
FIXED_MIB = 28_560_000_000 / MIB + 1024 + 819.2


def test_one_request_is_its_blocks_plus_the_null_block() -> None:
    assert one_request_kv_bytes(196_608, 8192) == (512 + 1) * 16 * 196_608
    # 8193 tokens take a 513th block.
    assert one_request_kv_bytes(196_608, 8193) == (513 + 1) * 16 * 196_608


def test_concurrency_is_whole_blocks_over_the_blocks_of_one_request() -> None:
    assert max_concurrency(1024 * 3 * MIB, 196_608, 8192) == 2.0
    assert max_concurrency(1024 * 3 * MIB - 1, 196_608, 8192) == 1023 / 512
    assert max_concurrency(0, 196_608, 8192) == 0.0


def test_max_num_seqs_does_not_multiply_the_needed_kv() -> None:
    four = backend_instance(backend(model_info=FOURTEEN_B))
    unset = backend_instance(
        backend(model_info={k: v for k, v in FOURTEEN_B.items() if k != "max_num_seqs"})
    )
    assert four is not None
    assert unset is not None
    assert four.kv_bytes == unset.kv_bytes == (512 + 1) * BLOCK_MIB * MIB


def pinned(utilization: float) -> Any:
    info = {**FOURTEEN_B, "gpu_memory_utilization": utilization}
    footprint = planned_footprint_mib(backend(model_info=info), gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.parts is not None
    return footprint.parts


def test_a_budget_for_one_full_request_fits_and_reports_its_concurrency() -> None:
    # U = 0.65: 31,948.8 - 29,080.138 = 2,868.66 MiB of KV = 956 blocks of 3 MiB: 1.87
    # requests of 8192 tokens. The old planner wanted 8192 x max_num_seqs 4 = 6 GiB: "NO".
    parts = pinned(0.65)
    assert parts.kv_cache_bytes / MIB == pytest.approx(0.65 * 49_152 - FIXED_MIB)
    assert parts.fits_gpu is True
    assert parts.problems == ()
    assert parts.max_concurrency == pytest.approx(956 / 512)


def test_less_than_one_full_request_is_vllms_refusal() -> None:
    # U = 0.62: 30,474.24 - 29,080.138 = 1,394.1 MiB, less than the 1,539 MiB one request of
    # 8192 tokens needs: vLLM raises "To serve at least one request with the model's max seq
    # len (8192) ..." and does not come up.
    info = {**FOURTEEN_B, "gpu_memory_utilization": 0.62}
    spec = backend_instance(backend(model_info=info))
    assert spec is not None
    plan = plan_share(ShareRequest(total_bytes=49_152 * MIB, instances=(spec,))).instances[0]
    assert not plan.ok
    assert not plan.runs
    assert any("To serve at least one request" in text for text in plan.problems)
    assert any("max_model_len 8192" in text for text in plan.problems)
    assert plan.expected_used_bytes == 0  # later instances are planned without it
    assert plan.advice == ("start it with --gpu-memory-utilization 0.63 instead",)


def test_the_chosen_utilization_leaves_one_full_request() -> None:
    # 29,080.138 + 1,539 = 30,619.138 MiB = 0.6229 x 49,152 -> 0.63 (was 0.72 for 4 x 8192).
    parts = pinned_auto()
    assert parts.gpu_memory_utilization == 0.63


def pinned_auto() -> Any:
    footprint = planned_footprint_mib(backend(model_info=FOURTEEN_B), gpu_total_mib=49_152)
    assert footprint is not None
    assert footprint.parts is not None
    return footprint.parts


@pytest.mark.parametrize(("seqs", "expected"), [(None, None), (4, ["--max-num-seqs", "4"])])
def test_max_num_seqs_is_printed_only_when_configured(
    seqs: int | None, expected: list[str] | None
) -> None:
    info = {k: v for k, v in FOURTEEN_B.items() if k != "max_num_seqs"}
    if seqs is not None:
        info["max_num_seqs"] = seqs
    config = backend(model_info=info)
    planned = resolve(config.model_info, config.hf_config)
    assert planned is not None
    spec = backend_instance(config)
    assert spec is not None
    plan = plan_share(ShareRequest(total_bytes=49_152 * MIB, instances=(spec,))).instances[0]
    argv, _ = vllm_command(config, planned, plan, sleep_mode=False)
    if expected is None:
        assert "--max-num-seqs" not in argv
    else:
        index = argv.index("--max-num-seqs")
        assert list(argv[index : index + 2]) == expected


def test_too_big_advises_a_shorter_context_not_fewer_sequences() -> None:
    # A 30 GiB GPU: it needs 512 + 27,236.938 + 1,024 + 819.2 + 1,539 = 31,131.1 MiB, 411.1 MiB
    # short. One request's 1,539 MiB of KV less 411.1 leaves 1,127.9 MiB = 375 blocks, one of
    # them the null block: at most 374 x 16 = 5,984 tokens.
    spec = backend_instance(backend(model_info=FOURTEEN_B))
    assert spec is not None
    plan = plan_share(ShareRequest(total_bytes=30_720 * MIB, instances=(spec,))).instances[0]
    assert not plan.ok
    assert any(
        text.startswith("or a shorter --max-model-len: one request of at most 5984 tokens")
        for text in plan.advice
    ), plan.advice

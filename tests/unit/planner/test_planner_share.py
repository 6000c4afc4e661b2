"""Several vLLM instances on one GPU: the two-instances article's attempts and fixes.

The article's GPU reports 31.84 GiB. Its instance B (DeepSeek-R1-14B-AWQ) has 9.4 GiB of weights,
a 1 GiB KV budget and runs with --enforce-eager; instance A (the 8B orchestrator) has 6.4 GiB of
weights, ~1.6 GiB of KV, ~8 GiB of CUDA graphs (captures [1, 2, 4]) and ~4.7 GiB of overhead.
The article ran vLLM 0.19, before vLLM 0.21 took the CUDA graphs' estimate from the
--gpu-memory-utilization budget, so its orchestrator is planned with graphs_in_budget=False (the
old accounting); test_graphs_inside_or_outside_the_budget has what current vLLM does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.planner.share import (
    InstancePlan,
    InstanceSpec,
    SharePlan,
    ShareRequest,
    plan_share,
)
from app.planner.units import GIB, gib_to_bytes

ARTICLE_GPU = gib_to_bytes(31.84)


def gib(value: float) -> int:
    return gib_to_bytes(value)


def deepseek(**overrides: Any) -> InstanceSpec:
    """Instance B as the article describes it; the CUDA context is folded in as the article does."""
    values: dict[str, Any] = {
        "name": "deepseek",
        "weight_bytes": gib(9.4),
        "kv_bytes": gib(1.0),
        "overhead_bytes": gib(1.0),
        "cuda_context_bytes": 0,
        "enforce_eager": True,
    }
    values.update(overrides)
    return InstanceSpec(**values)


def orchestrator(**overrides: Any) -> InstanceSpec:
    values: dict[str, Any] = {
        "name": "orchestrator",
        "weight_bytes": gib(6.4),
        "kv_bytes": gib(1.6),
        "graph_bytes": gib(8.0),
        "overhead_bytes": gib(4.7),
        "graphs_in_budget": False,  # vLLM 0.19: graphs on top of the budget
    }
    values.update(overrides)
    return InstanceSpec(**values)


def alone(spec: InstanceSpec, *, free_gib: float, **request: Any) -> InstancePlan:
    """Plan ``spec`` as the next instance on the article's GPU with ``free_gib`` free."""
    plan = plan_share(
        ShareRequest(
            total_bytes=ARTICLE_GPU,
            instances=(spec,),
            baseline_used_bytes=ARTICLE_GPU - gib(free_gib),
            **request,
        )
    )
    return plan.instances[0]


# ---------------------------------------------------------------- the article's failed attempts


@pytest.mark.parametrize(
    ("utilization", "requested_gib"),
    [
        (0.35, 11.144),  # attempt 1: 31.84 x 0.35 = 11.144 GiB > 8.8 GiB free
        (0.90, 28.656),  # attempt 2: 31.84 x 0.90 = 28.656 GiB
        (0.98, 31.2032),  # attempt 3: 31.84 x 0.98 = 31.2032 GiB
    ],
)
def test_attempts_1_to_3_fail_the_startup_check(utilization: float, requested_gib: float) -> None:
    # The orchestrator holds ~23 GiB, so B starts with 8.8 GiB free.
    plan = alone(deepseek(gpu_memory_utilization=utilization), free_gib=8.8)
    assert not plan.ok
    assert not plan.runs
    assert plan.requested_bytes / GIB == pytest.approx(requested_gib)
    assert plan.problems[0].startswith("start-up check fails: 8.80 GiB free")
    assert f"{utilization:g} x 31.84 GiB" in plan.problems[0]
    assert plan.expected_used_bytes == 0


def test_attempt_4_passes_startup_but_leaves_negative_kv() -> None:
    # 0.50 x 31.84 = 15.92 GiB <= 16.68 GiB free: the start-up check passes. The article's
    # "15.92 - 9.4 - overhead = -0.75 GiB" means an overhead of 7.27 GiB.
    plan = alone(deepseek(gpu_memory_utilization=0.50, overhead_bytes=gib(7.27)), free_gib=16.68)
    assert plan.requested_bytes / GIB == pytest.approx(15.92)
    assert plan.kv_bytes / GIB == pytest.approx(-0.75)
    assert not plan.runs
    assert len(plan.problems) == 2
    assert plan.problems[0].startswith("KV check fails: 15.92 GiB budget")
    assert "= -0.75 GiB for the KV cache" in plan.problems[0]


def test_the_articles_fix_cannot_work_with_its_own_overhead() -> None:
    # --kv-cache-memory-bytes 1 GiB at 0.50: start-up passes (15.92 <= 16.68), but B then holds
    # 9.4 + 7.27 + 1.0 = 17.67 GiB > 16.68 GiB free: the article's numbers do not add up.
    plan = alone(
        deepseek(gpu_memory_utilization=0.50, overhead_bytes=gib(7.27), kv_mode="kv-bytes"),
        free_gib=16.68,
    )
    assert plan.mode == "kv-bytes"
    assert plan.kv_cache_memory_bytes == 1_073_741_824
    assert not plan.ok
    assert plan.problems[0].startswith("out of memory: it needs 17.67 GiB but only 16.68 GiB")


def test_the_articles_fix_works_with_a_realistic_overhead() -> None:
    # 0.5 GiB CUDA context + 1 GiB overhead: footprint 0.5 + 9.4 + 1.0 + 1.0 = 11.9 GiB.
    # Start-up: 16.68 - 0.5 = 16.18 >= 15.92.  Left: 16.68 - 11.9 = 4.78 GiB.
    plan = alone(
        deepseek(gpu_memory_utilization=0.50, cuda_context_bytes=gib(0.5), kv_mode="kv-bytes"),
        free_gib=16.68,
    )
    assert plan.ok
    assert plan.flags == (
        "--gpu-memory-utilization",
        "0.50",
        "--kv-cache-memory-bytes",
        "1073741824",
        "--enforce-eager",
    )
    assert plan.expected_used_bytes / GIB == pytest.approx(11.9)
    assert plan.free_after_bytes / GIB == pytest.approx(4.78)


def test_with_per_instance_accounting_a_plain_utilization_also_works() -> None:
    # Current vLLM charges only B's own memory: U x 31.84 >= 9.4 + 1.0 + 1.0 = 11.4 GiB
    # -> U >= 0.35804 -> 0.36 on the 0.01 grid (11.4624 GiB <= 16.18 GiB free after the context).
    # KV = 11.4624 - 9.4 - 1.0 = 1.0624 GiB >= 1 GiB; holds 0.5 + 11.4624 = 11.9624 GiB.
    plan = alone(deepseek(cuda_context_bytes=gib(0.5)), free_gib=16.68)
    assert plan.ok
    assert plan.mode == "utilization"
    assert plan.kv_cache_memory_bytes is None
    assert plan.flags == ("--gpu-memory-utilization", "0.36", "--enforce-eager")
    assert plan.kv_bytes / GIB == pytest.approx(1.0624)
    assert plan.expected_used_bytes / GIB == pytest.approx(11.9624)


def test_which_utilizations_pass_with_per_instance_accounting() -> None:
    # Passing needs U x 31.84 >= 11.4 (KV check) and <= 16.18 (start-up): 0.36 .. 0.50.
    spec = deepseek(cuda_context_bytes=gib(0.5))
    passing = [k / 100 for k in range(1, 101) if alone(_pinned(spec, k / 100), free_gib=16.68).ok]
    assert passing == [k / 100 for k in range(36, 51)]


def test_legacy_accounting_has_no_valid_utilization_as_the_article_says() -> None:
    # Before vLLM PR #18974 the 15.16 GiB held by the orchestrator (and B's own context) were
    # charged to B: KV = U x 31.84 - 9.4 - 1.0 - 15.16 - 0.5, so the KV check needs
    # U x 31.84 >= 27.06 GiB while the start-up check needs U x 31.84 <= 16.18 GiB.
    spec = deepseek(cuda_context_bytes=gib(0.5))
    for k in range(1, 101):
        assert not alone(_pinned(spec, k / 100), free_gib=16.68, legacy_accounting=True).ok
    plan = alone(spec, free_gib=16.68, legacy_accounting=True)
    # --kv-cache-memory-bytes skips the profile; U = floor(11.4 / 31.84 = 0.358) = 0.35.
    assert plan.ok
    assert plan.mode == "kv-bytes"
    assert plan.flags == (
        "--gpu-memory-utilization",
        "0.35",
        "--kv-cache-memory-bytes",
        "1073741824",
        "--enforce-eager",
    )
    assert plan.notes[0].startswith("no --gpu-memory-utilization passes both vLLM checks")
    assert "legacy accounting" in plan.notes[0]
    assert ">= 27.06 GiB" in plan.notes[0]
    assert "the start-up check allows at most 16.18 GiB" in plan.notes[0]


def test_a_failed_pin_suggests_a_working_value() -> None:
    plan = alone(_pinned(deepseek(cuda_context_bytes=gib(0.5)), 0.90), free_gib=16.68)
    assert not plan.ok
    assert plan.advice == ("start it with --gpu-memory-utilization 0.36 --enforce-eager instead",)


def _pinned(spec: InstanceSpec, utilization: float) -> InstanceSpec:
    return InstanceSpec(
        name=spec.name,
        weight_bytes=spec.weight_bytes,
        kv_bytes=spec.kv_bytes,
        graph_bytes=spec.graph_bytes,
        overhead_bytes=spec.overhead_bytes,
        cuda_context_bytes=spec.cuda_context_bytes,
        enforce_eager=spec.enforce_eager,
        gpu_memory_utilization=utilization,
    )


# ---------------------------------------------------------------- both instances together


def test_orchestrator_graphs_leave_no_room_for_deepseek() -> None:
    # The CLI example: default 0.5 GiB CUDA contexts, B with the default 1 GiB overhead.
    # A: U = ceil((6.4 + 4.7 + 1.6) / 31.84 = 0.3989) = 0.40 -> 12.736 GiB budget; it holds
    #    0.5 + 12.736 + 8 (graphs, outside the budget) = 21.236 GiB; 10.604 GiB left.
    # B: needs 0.5 + 9.4 + 1.0 + 1.0 = 11.9 GiB > 10.604 GiB -> 1.296 GiB short.
    plan = plan_share(
        ShareRequest(
            total_bytes=ARTICLE_GPU,
            instances=(orchestrator(), deepseek(cuda_context_bytes=gib(0.5))),
        )
    )
    first, second = plan.instances
    assert first.ok
    assert first.flags == ("--gpu-memory-utilization", "0.40")
    assert first.expected_used_bytes / GIB == pytest.approx(21.236)
    assert second.free_at_start_bytes / GIB == pytest.approx(10.604)
    assert not second.ok
    assert not plan.fits
    assert second.problems[0].startswith("out of memory: it needs 11.90 GiB but only 10.60 GiB")
    assert second.advice[0].endswith("1.30 GiB short")
    assert second.advice[1] == (
        "instances started before it hold 8.00 GiB of CUDA graphs (orchestrator: 8.00 GiB); "
        "--enforce-eager or fewer captured batch sizes there frees up to 8.00 GiB - enough"
    )
    assert plan.free_bytes / GIB == pytest.approx(10.604)


def test_eager_orchestrator_makes_both_fit() -> None:
    # A eager: 0.5 + 12.736 = 13.236 GiB; B starts with 18.604 GiB and takes 11.9624 GiB.
    plan = plan_share(
        ShareRequest(
            total_bytes=ARTICLE_GPU,
            instances=(orchestrator(enforce_eager=True), deepseek(cuda_context_bytes=gib(0.5))),
        )
    )
    assert plan.fits
    assert [item.flags[1] for item in plan.instances] == ["0.40", "0.36"]
    assert plan.free_bytes / GIB == pytest.approx(31.84 - 13.236 - 11.9624)


def test_the_articles_table_leaves_a_third_of_a_gib_not_5_8() -> None:
    # The article's VRAM table: 6.4 + 1.6 + 8.0 + 4.7 (A) + 9.4 + 1.0 (B) + 0.4 (embeddings)
    # = 31.5 GiB of 31.84: at most 0.34 GiB free, not "~5.8 GiB". With the planner's 0.01 grid:
    # A 0.40 -> 12.736 + 8 = 20.736 GiB; B ceil(10.4 / 31.84 = 0.3266) = 0.33 -> 10.5072 GiB;
    # free = 31.84 - 0.4 - 20.736 - 10.5072 = 0.1968 GiB.
    plan = plan_share(
        ShareRequest(
            total_bytes=ARTICLE_GPU,
            instances=(
                orchestrator(cuda_context_bytes=0),
                deepseek(overhead_bytes=0),
            ),
            baseline_used_bytes=gib(0.4),
        )
    )
    assert plan.fits
    assert plan.free_bytes / GIB == pytest.approx(0.1968)
    assert plan.free_bytes < 0.34 * GIB


# ---------------------------------------------------------------- graphs, rounding, reserve


@pytest.mark.parametrize("graphs_in_budget", [True, False])
def test_own_graphs_that_do_not_fit_recommend_eager_or_fewer_sizes(graphs_in_budget: bool) -> None:
    # 24 GiB GPU: 0.5 + 14 + 1 + 8 (graphs) + 2 = 25.5 GiB > 24: 1.5 GiB short, so the graphs
    # may take at most 8 - 1.5 = 6.5 GiB, wherever vLLM counts them.
    spec = InstanceSpec(
        name="big",
        weight_bytes=gib(14),
        kv_bytes=gib(2),
        graph_bytes=gib(8),
        overhead_bytes=gib(1),
        graphs_in_budget=graphs_in_budget,
    )
    plan = plan_share(ShareRequest(total_bytes=gib(24), instances=(spec,)))
    item = plan.instances[0]
    assert not item.ok
    # Inside: U x 24 >= 14 + 1 + 2 + 8 = 25 GiB has no U <= 1; outside: U = 0.71 passes the KV
    # check but 0.5 + 17.04 + 8 > 24. Either way the planner falls back to
    # --kv-cache-memory-bytes, where vLLM captures the graphs after the fixed KV cache.
    assert item.mode == "kv-bytes"
    assert "are captured last, outside --gpu-memory-utilization, and do not fit" in item.problems[0]
    assert item.advice[1] == (
        "its CUDA graphs do not fit: use --enforce-eager (frees 8.00 GiB) or capture fewer batch "
        "sizes (lower --max-num-seqs or the compilation config's max_cudagraph_capture_size) so "
        "they take at most 6.50 GiB"
    )


def test_graphs_inside_or_outside_the_budget() -> None:
    # vLLM 0.33, Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py):
    #   available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory
    #                                     - cudagraph_memory_estimate_applied
    # with the estimate applied while VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (vllm/envs.py's
    # default since v0.21.0). W = 10, O = 1, G = 4, K = 2 GiB on a 24 GiB GPU, C = 0.5 GiB.
    spec = InstanceSpec(
        name="m", weight_bytes=gib(10), kv_bytes=gib(2), graph_bytes=gib(4), overhead_bytes=gib(1)
    )
    assert spec.graphs_in_budget  # the default is current vLLM
    # Inside (the default): U = ceil((10 + 1 + 2 + 4) / 24 = 17 / 24 = 0.7083) = 0.71,
    # KV = 0.71 x 24 - 10 - 1 - 4 = 17.04 - 15 = 2.04 GiB, holds C + U x T = 0.5 + 17.04 = 17.54.
    inside = plan_share(ShareRequest(total_bytes=gib(24), instances=(spec,))).instances[0]
    assert inside.flags == ("--gpu-memory-utilization", "0.71")
    assert inside.kv_bytes / GIB == pytest.approx(2.04)
    assert inside.expected_used_bytes / GIB == pytest.approx(17.54)
    assert inside.notes == ()
    # The option (vLLM < 0.21 or VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0), the old accounting:
    # U = ceil((10 + 1 + 2) / 24 = 0.5417) = 0.55, KV = 13.2 - 11 = 2.2 GiB,
    # holds C + U x T + G = 0.5 + 13.2 + 4 = 17.7 GiB.
    old = replace(spec, graphs_in_budget=False)
    outside = plan_share(ShareRequest(total_bytes=gib(24), instances=(old,))).instances[0]
    assert outside.flags == ("--gpu-memory-utilization", "0.55")
    assert outside.kv_bytes / GIB == pytest.approx(2.2)
    assert outside.expected_used_bytes / GIB == pytest.approx(17.7)
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in outside.notes[0]


def test_a_utilization_planned_for_graphs_on_top_starves_a_current_vllm() -> None:
    # The finding: U = 0.55 was planned with the graphs on top. vLLM 0.33 takes them from the
    # budget: KV = 0.55 x 24 - 10 - 1 - 4 = 13.2 - 15 < 0 -> "No available memory for the cache
    # blocks" (vllm/v1/core/kv_cache_planning.py, _check_enough_kv_cache_memory).
    spec = InstanceSpec(
        name="m",
        weight_bytes=gib(10),
        kv_bytes=gib(2),
        graph_bytes=gib(4),
        overhead_bytes=gib(1),
        gpu_memory_utilization=0.55,
    )
    item = plan_share(ShareRequest(total_bytes=gib(24), instances=(spec,))).instances[0]
    assert not item.runs
    assert item.kv_bytes / GIB == pytest.approx(-1.8)
    assert item.problems[0].startswith(
        "KV check fails: 13.20 GiB budget - weights 10.00 GiB - overhead 1.00 GiB - CUDA graphs "
        "4.00 GiB = -1.80 GiB"
    )


def test_tight_fit_switches_to_kv_cache_memory_bytes() -> None:
    # 32 GiB GPU with 12.6 GiB free; footprint 0.5 + 10 + 1 + 1 = 12.5 GiB fits.
    # Plain U = ceil(12 / 32 = 0.375) = 0.38 -> 12.16 GiB > 12.1 GiB free after the context.
    # --kv-cache-memory-bytes with U = floor(0.375) = 0.37 -> 11.84 GiB passes and holds 12.5.
    spec = InstanceSpec(name="m", weight_bytes=gib(10), kv_bytes=gib(1), overhead_bytes=gib(1))
    request: dict[str, Any] = {
        "total_bytes": gib(32),
        "instances": (spec,),
        "baseline_used_bytes": gib(19.4),
    }
    item = plan_share(ShareRequest(**request)).instances[0]
    assert item.ok
    assert item.mode == "kv-bytes"
    assert item.flags == (
        "--gpu-memory-utilization",
        "0.37",
        "--kv-cache-memory-bytes",
        "1073741824",
    )
    # 12 / 32 = 0.3750 (KV check) .. 12.1 / 32 = 0.3781 (free after the context).
    assert "no 0.01 step of U lies between 0.3750 (KV check) and 0.3781" in item.notes[0]
    # A finer grid finds U = 0.375 exactly (12.0 GiB <= 12.1 GiB).
    fine = plan_share(ShareRequest(**request, utilization_step=0.001)).instances[0]
    assert fine.mode == "utilization"
    assert fine.flags == ("--gpu-memory-utilization", "0.375")
    # Forcing plain utilization reports why it cannot start.
    forced = plan_share(
        ShareRequest(
            total_bytes=gib(32),
            instances=(_with_mode(spec, "utilization"),),
            baseline_used_bytes=gib(19.4),
        )
    ).instances[0]
    assert not forced.ok
    assert forced.problems[0].startswith("start-up check fails")
    assert forced.advice == (
        "start it with --gpu-memory-utilization 0.37 --kv-cache-memory-bytes 1073741824 instead",
    )


def _with_mode(spec: InstanceSpec, mode: Any) -> InstanceSpec:
    return InstanceSpec(
        name=spec.name,
        weight_bytes=spec.weight_bytes,
        kv_bytes=spec.kv_bytes,
        overhead_bytes=spec.overhead_bytes,
        kv_mode=mode,
    )


def test_reserve_that_is_not_left_means_no_fit() -> None:
    # B alone with 16.68 GiB free leaves 16.68 - 11.9624 = 4.7176 GiB < 5 GiB reserve.
    plan = plan_share(
        ShareRequest(
            total_bytes=ARTICLE_GPU,
            instances=(deepseek(cuda_context_bytes=gib(0.5)),),
            baseline_used_bytes=ARTICLE_GPU - gib(16.68),
            reserve_bytes=gib(5),
        )
    )
    assert plan.instances[0].ok
    assert not plan.fits
    assert plan.problems == ("only 4.72 GiB stays free, less than the 5.00 GiB reserve",)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ShareRequest(total_bytes=gib(24), instances=()), "at least one instance"),
        (
            lambda: ShareRequest(total_bytes=gib(24), instances=(deepseek(), deepseek())),
            "unique",
        ),
        (
            lambda: ShareRequest(
                total_bytes=gib(24), instances=(deepseek(),), baseline_used_bytes=gib(24)
            ),
            "less than the GPU's total",
        ),
        (lambda: ShareRequest(total_bytes=0, instances=(deepseek(),)), "GPU memory"),
        (
            lambda: ShareRequest(total_bytes=gib(24), instances=(deepseek(),), utilization_step=0),
            "utilization step",
        ),
        (lambda: deepseek(graph_bytes=-1), "CUDA-graph memory"),
        (lambda: deepseek(weight_bytes=0), "weights must be a positive"),
        (lambda: deepseek(kv_bytes=-5), "KV budget"),
        (lambda: deepseek(gpu_memory_utilization=1.2), "<= 1"),
        (lambda: deepseek(kv_mode="sometimes"), "kv_mode"),
        (lambda: deepseek(name=" "), "name must not be empty"),
    ],
)
def test_share_input_validation(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


# ---------------------------------------------------------------- properties

sizes = st.floats(min_value=0.1, max_value=30.0, allow_nan=False)
instances = st.lists(
    st.builds(
        lambda w, k, g, o, c, eager, mode: (w, k, g, o, c, eager, mode),
        sizes,
        sizes,
        st.floats(min_value=0.0, max_value=15.0),
        st.floats(min_value=0.0, max_value=8.0),
        st.floats(min_value=0.0, max_value=1.0),
        st.booleans(),
        st.sampled_from(["auto", "utilization", "kv-bytes"]),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=200)
@given(
    total=st.floats(min_value=8.0, max_value=160.0),
    baseline=st.floats(min_value=0.0, max_value=0.5),
    raw=instances,
    graphs_in_budget=st.booleans(),
    legacy=st.booleans(),
)
def test_every_ok_instance_passes_vllms_checks_and_fits(
    total: float,
    baseline: float,
    raw: list[tuple[float, float, float, float, float, bool, Any]],
    graphs_in_budget: bool,
    legacy: bool,
) -> None:
    specs = tuple(
        InstanceSpec(
            name=f"i{index}",
            weight_bytes=gib(w),
            kv_bytes=gib(k),
            graph_bytes=gib(g),
            overhead_bytes=gib(o),
            cuda_context_bytes=gib(c),
            enforce_eager=eager,
            kv_mode=mode,
            graphs_in_budget=graphs_in_budget,
        )
        for index, (w, k, g, o, c, eager, mode) in enumerate(raw)
    )
    request = ShareRequest(
        total_bytes=gib(total),
        instances=specs,
        baseline_used_bytes=gib(total * baseline),
        legacy_accounting=legacy,
    )
    plan = plan_share(request)
    _check_invariants(request, plan)


def _check_invariants(request: ShareRequest, plan: SharePlan) -> None:
    free = float(request.total_bytes - request.baseline_used_bytes)
    for spec, item in zip(request.instances, plan.instances, strict=True):
        assert item.free_at_start_bytes == pytest.approx(free)
        if item.ok:
            # vLLM's start-up check: free after the context >= utilization x total.
            requested = item.gpu_memory_utilization * request.total_bytes
            assert requested <= free - spec.cuda_context_bytes + 1e-6
            assert 0 < item.gpu_memory_utilization <= 1
            # It gets at least its KV budget and physically fits.
            assert item.kv_bytes >= spec.kv_bytes - 1e-6
            assert item.expected_used_bytes <= free + 1e-6
            assert item.expected_used_bytes >= spec.footprint_bytes - 1e-6
            if item.mode == "kv-bytes":
                assert item.kv_cache_memory_bytes == spec.kv_bytes
                assert "--kv-cache-memory-bytes" in item.flags
            else:
                assert item.kv_cache_memory_bytes is None
        else:
            assert item.problems
        if not item.runs:
            assert item.expected_used_bytes == 0
        if spec.enforce_eager:
            assert "--enforce-eager" in item.flags
        free -= item.expected_used_bytes
        assert item.free_after_bytes == pytest.approx(free)
    assert plan.free_bytes == pytest.approx(free)
    assert plan.fits == (all(item.ok for item in plan.instances) and not plan.problems)

"""KAITO-style longest context and fewest GPUs, with hand-checked numbers and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.planner.sizing import (
    SizingConstants,
    per_gpu_budget,
    plan_max_context,
    plan_min_gpus,
)
from app.planner.units import GIB, MIB

PHI4_MINI_WEIGHTS = 7.15 * GIB
PHI4_MINI_BYTES_PER_TOKEN = 131_072
PHI4_MINI_LIMIT = 131_072


# ---------------------------------------------------------------- KAITO's worked example


def test_kaito_phi4_mini_on_a10_24_gib() -> None:
    # usable = 24 x 0.84 = 20.16 GiB; weights = 7.15 x 1.02 = 7.293 GiB; overhead 2.3 GiB
    # remaining = 20.16 - 7.293 - 2.3 = 10.567 GiB; tokens = 10.567 x 2**30 / 131,072
    # = 10.567 x 8,192 = 86,564.9 -> 86,564 (the docs round to 10.57 GiB first: 86,589);
    # under the 131,072 limit; aligned down to 256: 338 x 256 = 86,528.
    plan = plan_max_context(
        gpu_bytes=24 * GIB,
        weight_bytes=PHI4_MINI_WEIGHTS,
        kv_bytes_per_token=PHI4_MINI_BYTES_PER_TOKEN,
        model_limit=PHI4_MINI_LIMIT,
    )
    assert plan.raw_tokens == 86_564
    assert plan.max_context_tokens == 86_528
    assert not plan.clamped
    assert plan.budget.usable_bytes / GIB == pytest.approx(20.16)
    assert plan.budget.weight_bytes / GIB == pytest.approx(7.293)
    assert plan.budget.remaining_bytes / GIB == pytest.approx(10.567)


def test_kaito_phi4_mini_on_a100_80_gib_is_clamped_to_the_model_limit() -> None:
    # remaining = 80 x 0.84 - 7.293 - 2.3 = 57.607 GiB; x 8,192 = 471,916.5 -> 471,916 tokens
    # (docs: 471,941 from the rounded 57.61); clamped to 131,072, already a multiple of 256.
    plan = plan_max_context(
        gpu_bytes=80 * GIB,
        weight_bytes=PHI4_MINI_WEIGHTS,
        kv_bytes_per_token=PHI4_MINI_BYTES_PER_TOKEN,
        model_limit=PHI4_MINI_LIMIT,
    )
    assert plan.raw_tokens == 471_916
    assert plan.clamped
    assert plan.max_context_tokens == 131_072
    assert "clamped" in plan.reason


def test_kaito_2139_weight_proportional_overhead_on_a10() -> None:
    # overhead = 2.3 + 0.05 x 7.293 = 2.66465 GiB; remaining = 20.16 - 7.293 - 2.66465
    # = 10.20235 GiB; x 8,192 = 83,577.65 -> 83,577; aligned: 326 x 256 = 83,456
    # (the same aligned value as the research notes, which start from a rounded 10.21 GiB).
    plan = plan_max_context(
        gpu_bytes=24 * GIB,
        weight_bytes=PHI4_MINI_WEIGHTS,
        kv_bytes_per_token=PHI4_MINI_BYTES_PER_TOKEN,
        model_limit=PHI4_MINI_LIMIT,
        constants=SizingConstants(overhead_weight_fraction=0.05),
    )
    assert plan.raw_tokens == 83_577
    assert plan.max_context_tokens == 83_456


def test_kaito_step_one_phi4_mini_needs_one_a100() -> None:
    # 7.293 + 2.3 + 2,048 x 131,072 / 2**30 (= 0.25) = 9.843 GiB <= 67.2 GiB on 1 GPU.
    plan = plan_min_gpus(
        gpu_bytes=80 * GIB,
        weight_bytes=PHI4_MINI_WEIGHTS,
        kv_bytes_per_token=PHI4_MINI_BYTES_PER_TOKEN,
    )
    assert (plan.min_gpus, plan.min_nodes, plan.fits) == (1, 1, True)
    assert plan.context_tokens == 2048
    assert plan.needed_bytes_per_gpu is not None
    assert plan.needed_bytes_per_gpu / GIB == pytest.approx(9.843)


# ---------------------------------------------------------------- multi-GPU and sharding


def test_two_gpus_split_weights_and_kv() -> None:
    # 2 x 80 GiB, 100 GiB weights, 327,680 B/token (Llama-70B bf16 shape), 8 KV heads:
    # weights per GPU = 100 x 1.02 / 2 = 51 GiB; remaining = 67.2 - 51 - 2.3 = 13.9 GiB;
    # KV per GPU per token = 327,680 / 2 = 163,840; 13.9 x 2**30 / 163,840 = 91,095.04
    # -> 91,095; aligned: 355 x 256 = 90,880.
    plan = plan_max_context(
        gpu_bytes=80 * GIB,
        weight_bytes=100 * GIB,
        kv_bytes_per_token=327_680,
        gpus=2,
        model_limit=131_072,
        kv_shard_limit=8,
    )
    assert plan.budget.kv_shards == 2
    assert plan.raw_tokens == 91_095
    assert plan.max_context_tokens == 90_880


def test_kv_heads_limit_how_far_the_cache_shards() -> None:
    # 2 KV heads on 4 GPUs: each GPU keeps a whole head, so KV splits only 2 ways.
    # bytes/token = 2 x 32 x 2 x 128 x 2 = 32,768 -> 16,384 per GPU (not 8,192).
    # remaining = 80 x 0.84 - 100 x 1.02 / 4 - 2.3 = 67.2 - 25.5 - 2.3 = 39.4 GiB
    # tokens = 39.4 x 2**30 / 16,384 = 39.4 x 65,536 = 2,582,118.4 -> 2,582,118.
    common: dict[str, Any] = {
        "gpu_bytes": 80 * GIB,
        "weight_bytes": 100 * GIB,
        "kv_bytes_per_token": 32_768,
    }
    limited = plan_max_context(**common, gpus=4, kv_shard_limit=2)
    unlimited = plan_max_context(**common, gpus=4)
    assert limited.budget.kv_shards == 2
    assert limited.raw_tokens == 2_582_118
    # KAITO's plain "/ N" would promise twice as much.
    assert unlimited.budget.kv_shards == 4
    assert unlimited.raw_tokens == 5_164_236


def test_mla_kv_is_replicated_not_sharded() -> None:
    # DeepSeek-V3 (70,272 B/token) on 8 x 140 GiB with 642 GiB of weights: every GPU holds the
    # whole latent cache, so it gets 1/8 of the tokens KAITO's "/ N" formula would give.
    common: dict[str, Any] = {
        "gpu_bytes": 140 * GIB,
        "weight_bytes": 642 * GIB,
        "kv_bytes_per_token": 70_272,
    }
    mla = plan_max_context(**common, gpus=8, kv_shard_limit=1)
    naive = plan_max_context(**common, gpus=8)
    assert mla.budget.kv_shards == 1
    assert abs(naive.raw_tokens - 8 * mla.raw_tokens) < 8
    # remaining = 140 x 0.84 - 642 x 1.02 / 8 - 2.3 = 117.6 - 81.855 - 2.3 = 33.445 GiB
    # 33.445 x 2**30 / 70,272 = 33.445 x 15,279.8 = 511,032.8 -> 511,032 tokens.
    assert mla.raw_tokens == 511_032


# ---------------------------------------------------------------- edges


def test_no_room_for_kv_gives_zero_tokens_and_a_reason() -> None:
    # 24 x 0.84 = 20.16 GiB usable < 20 x 1.02 + 2.3 = 22.7 GiB of weights and overhead.
    plan = plan_max_context(gpu_bytes=24 * GIB, weight_bytes=20 * GIB, kv_bytes_per_token=131_072)
    assert plan.max_context_tokens == 0
    assert plan.budget.remaining_bytes < 0
    assert "no memory left for the KV cache" in plan.reason
    assert "-2.54 GiB" in plan.reason


def test_less_than_one_alignment_block_gives_zero() -> None:
    # remaining = 10 - 9.99 = 0.01 GiB; 0.01 x 8,192 = 81.9 -> 81 tokens < 256.
    exact = SizingConstants(utilization=1.0, weight_expansion=1.0, overhead_bytes=0.0)
    plan = plan_max_context(
        gpu_bytes=10 * GIB, weight_bytes=9.99 * GIB, kv_bytes_per_token=131_072, constants=exact
    )
    assert plan.raw_tokens == 81
    assert plan.max_context_tokens == 0
    assert "less than one 256-token block" in plan.reason


def test_clamp_to_a_limit_that_is_not_a_multiple_of_256() -> None:
    # 40,000 // 256 x 256 = 156 x 256 = 39,936.
    plan = plan_max_context(
        gpu_bytes=80 * GIB, weight_bytes=1 * GIB, kv_bytes_per_token=1024, model_limit=40_000
    )
    assert plan.clamped
    assert plan.max_context_tokens == 39_936


def test_alignment_is_overridable() -> None:
    plan = plan_max_context(
        gpu_bytes=24 * GIB,
        weight_bytes=PHI4_MINI_WEIGHTS,
        kv_bytes_per_token=PHI4_MINI_BYTES_PER_TOKEN,
        constants=SizingConstants(alignment=1),
    )
    assert plan.max_context_tokens == plan.raw_tokens == 86_564


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_bytes": 0}, "GPU memory must be a positive"),
        ({"weight_bytes": -1}, "weights must be a positive"),
        ({"kv_bytes_per_token": 0}, "KV bytes per token"),
        ({"gpus": 0}, "GPU count"),
        ({"model_limit": 0}, "model context limit"),
        ({"kv_shard_limit": 0}, "KV shard limit"),
    ],
)
def test_plan_max_context_rejects_bad_input(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "gpu_bytes": 24 * GIB,
        "weight_bytes": 7 * GIB,
        "kv_bytes_per_token": 131_072,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        plan_max_context(**args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"utilization": 1.5}, "<= 1"),
        ({"utilization": 0.0}, "utilization must be a positive"),
        ({"weight_expansion": -1.0}, "weight expansion"),
        ({"overhead_bytes": -1.0}, "overhead"),
        ({"alignment": 0}, "alignment"),
        ({"overhead_weight_fraction": float("inf")}, "overhead weight fraction"),
    ],
)
def test_sizing_constants_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SizingConstants(**kwargs)


# ---------------------------------------------------------------- fewest GPUs


def test_min_gpus_for_a_70b_model() -> None:
    # 130 GiB weights on 80 GiB GPUs (67.2 usable), 327,680 B/token x 2,048 = 0.625 GiB KV:
    # N=1: 132.6 + 2.3 + 0.625 = 135.5 > 67.2; N=2: 66.3 + 2.3 + 0.3125 = 68.9 > 67.2;
    # N=3: 44.2 + 2.3 + 0.208 = 46.7 <= 67.2 -> 3 GPUs.
    common: dict[str, Any] = {
        "gpu_bytes": 80 * GIB,
        "weight_bytes": 130 * GIB,
        "kv_bytes_per_token": 327_680,
    }
    assert plan_min_gpus(**common).min_gpus == 3  # heads unknown: memory alone
    assert plan_min_gpus(**common, gpus_per_node=8).min_nodes == 1


def test_tensor_parallel_takes_a_divisor_of_the_attention_heads() -> None:
    # As above, with Llama-3.1-70B's 64 attention heads: 3 GPUs hold it, but vLLM refuses a
    # tensor-parallel size that does not divide the heads (vllm/config/model.py:1559): 4.
    common: dict[str, Any] = {
        "gpu_bytes": 80 * GIB,
        "weight_bytes": 130 * GIB,
        "kv_bytes_per_token": 327_680,
        "attention_heads": 64,
    }
    plan = plan_min_gpus(**common)
    assert (plan.min_gpus, plan.memory_gpus, plan.tensor_parallel) == (4, 3, 4)
    assert (plan.pipeline_parallel, plan.min_nodes) == (1, 1)
    assert plan.reason.startswith(
        "3 GPU(s) hold it; tensor parallelism needs a divisor of 64 heads: 4 (4 GPU(s) need "
    )
    # 40 heads (Qwen2.5-14B style): 3 is no divisor either, 4 is.
    assert plan_min_gpus(**{**common, "attention_heads": 40}).min_gpus == 4
    # 48 heads: 3 divides them.
    assert plan_min_gpus(**{**common, "attention_heads": 48}).min_gpus == 3


def test_across_nodes_tensor_parallel_stays_in_a_node_and_pipeline_spans_them() -> None:
    # Two GPUs per node: TP 2 alone needs 66.3 + 2.3 + 0.3125 = 68.9 > 67.2 GiB usable. So TP 2
    # in each node x 2 pipeline stages over 2 nodes: 130 x 1.02 / 4 = 33.15 + 2.3 + 0.625 / 4.
    plan = plan_min_gpus(
        gpu_bytes=80 * GIB,
        weight_bytes=130 * GIB,
        kv_bytes_per_token=327_680,
        attention_heads=64,
        gpus_per_node=2,
    )
    assert (plan.min_gpus, plan.min_nodes) == (4, 2)
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (2, 2)
    assert plan.needed_bytes_per_gpu == pytest.approx(
        (130 * 1.02 / 4 + 2.3) * GIB + 0.625 / 4 * GIB
    )
    assert "tensor parallel 2 within each node x pipeline parallel 2 across nodes" in plan.reason
    # Six GPUs per node and 64 heads: TP 4 (6 does not divide 64) and 2 stages, one per node.
    six = plan_min_gpus(
        gpu_bytes=40 * GIB,
        weight_bytes=250 * GIB,
        kv_bytes_per_token=327_680,
        attention_heads=64,
        gpus_per_node=6,
    )
    assert (six.tensor_parallel, six.min_nodes) == (4, six.pipeline_parallel)
    assert six.pipeline_parallel is not None
    assert six.pipeline_parallel >= 2


def test_no_divisor_in_one_node_says_so() -> None:
    plan = plan_min_gpus(
        gpu_bytes=80 * GIB,
        weight_bytes=130 * GIB,
        kv_bytes_per_token=327_680,
        attention_heads=64,
        max_gpus=3,
    )
    assert not plan.fits
    assert plan.reason.startswith(
        "3 GPU(s) hold it, but no tensor-parallel size from 3 to 3 divides the model's 64 "
        "attention heads"
    )


def test_min_gpus_takes_an_exact_fit_without_an_extra_gpu() -> None:
    # utilization 1, expansion 1, overhead 0.5 GiB; 64 GiB GPUs; 126 GiB of weights;
    # KV = 1,024 tokens x 1 MiB = 1 GiB. N=2: 63 + 0.5 + 0.5 = 64 GiB = usable -> fits.
    # KAITO's floor(126 / (64 - 0.5 - 0.5)) + 1 = floor(2) + 1 = 3 would ask for a third GPU.
    plan = plan_min_gpus(
        gpu_bytes=64 * GIB,
        weight_bytes=126 * GIB,
        kv_bytes_per_token=MIB,
        context_tokens=1024,
        constants=SizingConstants(utilization=1.0, weight_expansion=1.0, overhead_bytes=GIB / 2),
    )
    assert plan.min_gpus == 2


def test_min_gpus_says_when_the_kv_cache_alone_never_fits() -> None:
    # MLA: 1,000,000 tokens x 70,272 B = 65.45 GiB on every GPU, + 2.3 > 67.2 usable.
    plan = plan_min_gpus(
        gpu_bytes=80 * GIB,
        weight_bytes=642 * GIB,
        kv_bytes_per_token=70_272,
        context_tokens=1_000_000,
        kv_shard_limit=1,
    )
    assert not plan.fits
    assert plan.min_gpus is None
    assert plan.min_nodes is None
    assert "nothing fits at any GPU count" in plan.reason
    assert "cannot be split further" in plan.reason


def test_min_gpus_says_when_nothing_up_to_the_maximum_fits() -> None:
    plan = plan_min_gpus(
        gpu_bytes=80 * GIB, weight_bytes=10_000 * GIB, kv_bytes_per_token=131_072, max_gpus=8
    )
    assert not plan.fits
    assert "nothing up to 8 GPUs fits" in plan.reason


# ---------------------------------------------------------------- properties

gib_amounts = st.floats(min_value=0.5, max_value=512.0, allow_nan=False)
bytes_per_token = st.integers(min_value=1, max_value=4_000_000)
limits = st.none() | st.integers(min_value=1, max_value=2_000_000)
alignments = st.sampled_from([1, 16, 256, 1000])


@given(
    smaller=gib_amounts,
    extra=st.floats(min_value=0.0, max_value=512.0, allow_nan=False),
    weights=gib_amounts,
    per_token=bytes_per_token,
    gpus=st.integers(min_value=1, max_value=16),
    limit=limits,
    shard_limit=st.none() | st.integers(min_value=1, max_value=16),
)
def test_more_gpu_memory_never_gives_less_context(
    smaller: float,
    extra: float,
    weights: float,
    per_token: int,
    gpus: int,
    limit: int | None,
    shard_limit: int | None,
) -> None:
    common: dict[str, Any] = {
        "weight_bytes": weights * GIB,
        "kv_bytes_per_token": per_token,
        "gpus": gpus,
        "model_limit": limit,
        "kv_shard_limit": shard_limit,
    }
    small = plan_max_context(gpu_bytes=smaller * GIB, **common)
    large = plan_max_context(gpu_bytes=(smaller + extra) * GIB, **common)
    assert large.max_context_tokens >= small.max_context_tokens


@given(
    gpu=gib_amounts,
    weights=gib_amounts,
    per_token=bytes_per_token,
    gpus=st.integers(min_value=1, max_value=15),
    limit=limits,
)
def test_more_gpus_never_give_less_context(
    gpu: float, weights: float, per_token: int, gpus: int, limit: int | None
) -> None:
    fewer = plan_max_context(
        gpu_bytes=gpu * GIB,
        weight_bytes=weights * GIB,
        kv_bytes_per_token=per_token,
        gpus=gpus,
        model_limit=limit,
        kv_shard_limit=8,
    )
    more = plan_max_context(
        gpu_bytes=gpu * GIB,
        weight_bytes=weights * GIB,
        kv_bytes_per_token=per_token,
        gpus=gpus + 1,
        model_limit=limit,
        kv_shard_limit=8,
    )
    assert more.max_context_tokens >= fewer.max_context_tokens


@given(
    gpu=gib_amounts,
    weights=gib_amounts,
    per_token=bytes_per_token,
    gpus=st.integers(min_value=1, max_value=16),
    limit=limits,
    alignment=alignments,
)
def test_alignment_and_clamping_always_hold(
    gpu: float, weights: float, per_token: int, gpus: int, limit: int | None, alignment: int
) -> None:
    plan = plan_max_context(
        gpu_bytes=gpu * GIB,
        weight_bytes=weights * GIB,
        kv_bytes_per_token=per_token,
        gpus=gpus,
        model_limit=limit,
        constants=SizingConstants(alignment=alignment),
    )
    tokens = plan.max_context_tokens
    assert tokens % alignment == 0
    assert tokens >= 0
    if limit is not None:
        assert tokens <= limit
    assert tokens <= max(plan.raw_tokens, 0)
    # Alignment never throws away a whole block that would fit.
    bound = plan.raw_tokens if limit is None else min(plan.raw_tokens, limit)
    assert bound - tokens < alignment
    # What is promised really fits in what is left per GPU.
    assert tokens * plan.budget.kv_bytes_per_token <= max(plan.budget.remaining_bytes, 0.0)


@given(
    gpu=gib_amounts,
    weights=st.floats(min_value=0.5, max_value=4096.0, allow_nan=False),
    per_token=bytes_per_token,
    context=st.integers(min_value=1, max_value=200_000),
    heads=st.none() | st.sampled_from([8, 24, 32, 40, 64, 128]),
)
def test_min_gpus_is_the_smallest_count_that_fits(
    gpu: float, weights: float, per_token: int, context: int, heads: int | None
) -> None:
    common: dict[str, Any] = {
        "gpu_bytes": gpu * GIB,
        "weight_bytes": weights * GIB,
        "kv_bytes_per_token": per_token,
    }
    plan = plan_min_gpus(**common, context_tokens=context, attention_heads=heads, max_gpus=64)

    def need(n: int) -> float:
        budget = per_gpu_budget(**common, gpus=n)
        return budget.weight_bytes + budget.overhead_bytes + context * budget.kv_bytes_per_token

    usable = gpu * GIB * 0.84
    if plan.min_gpus is None:
        assert all(need(n) > usable for n in range(1, 65) if heads is None or heads % n == 0)
        return
    assert need(plan.min_gpus) <= usable
    assert heads is None or heads % plan.min_gpus == 0
    # No smaller valid tensor-parallel size fits.
    assert all(need(n) > usable for n in range(1, plan.min_gpus) if heads is None or heads % n == 0)
    assert (plan.min_nodes, plan.tensor_parallel, plan.pipeline_parallel) == (
        1,
        plan.min_gpus,
        1,
    )


@given(
    gpu=gib_amounts,
    weights=st.floats(min_value=0.5, max_value=4096.0, allow_nan=False),
    per_token=bytes_per_token,
    per_node=st.integers(min_value=1, max_value=8),
    heads=st.none() | st.sampled_from([8, 24, 32, 40, 64, 128]),
)
def test_tensor_parallel_never_spans_nodes(
    gpu: float, weights: float, per_token: int, per_node: int, heads: int | None
) -> None:
    plan = plan_min_gpus(
        gpu_bytes=gpu * GIB,
        weight_bytes=weights * GIB,
        kv_bytes_per_token=per_token,
        gpus_per_node=per_node,
        attention_heads=heads,
        max_gpus=64,
    )
    if plan.min_gpus is None:
        return
    assert plan.tensor_parallel is not None
    assert plan.pipeline_parallel is not None
    assert plan.min_nodes is not None
    assert plan.tensor_parallel <= per_node
    assert heads is None or heads % plan.tensor_parallel == 0
    assert plan.min_gpus == plan.tensor_parallel * plan.pipeline_parallel
    assert plan.min_nodes * per_node >= plan.min_gpus
    assert plan.needed_bytes_per_gpu is not None
    assert plan.needed_bytes_per_gpu <= plan.usable_bytes_per_gpu

"""``microscheduler plan ...`` through argparse, as the main CLI will run it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from app.cli.plan import add_plan_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="microscheduler")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_plan_command(subparsers)
    return parser


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = build_parser().parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(
    argv: list[str], capsys: pytest.CaptureFixture[str], *, code: int = 0
) -> dict[str, Any]:
    """The command's JSON answer; `code` 1 for a plan that does not fit."""
    exit_code, out, err = run([*argv, "--json"], capsys)
    assert (exit_code, err) == (code, "")
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def assert_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: plan {argv[1]}: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


# ---------------------------------------------------------------- plan kv


def test_kv_from_shape_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # 2 x 48 x 4 x 128 x 2 = 98,304; x 16,384 x 32 = 48 GiB.
    data = run_json(
        [
            "plan",
            "kv",
            "--layers",
            "48",
            "--kv-heads",
            "4",
            "--head-dim",
            "128",
            "--kv-dtype",
            "fp16",
            "--context",
            "16384",
            "--seqs",
            "32",
        ],
        capsys,
    )
    assert data["kv_bytes_per_token"] == 98_304
    assert data["kv_cache_bytes"] == 51_539_607_552
    assert data["kv_cache_gib"] == 48.0
    assert data["kv_dtype"] == "fp16"


def test_kv_from_catalog_uses_the_model_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(["plan", "kv", "--model", "Qwen/Qwen3-30B-A3B"], capsys)
    assert data["model"] == "qwen3-30b-a3b"
    assert data["kv_dtype"] == "bf16"
    assert data["kv_bytes_per_token"] == 98_304
    assert "kv_cache_bytes" not in data


def test_kv_tq4(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-R1-Distill-Qwen-14B, tq4: 48 x 8 x (68 + 68) = 52,224 B; x 8,192 = 427,819,008.
    data = run_json(
        [
            "plan",
            "kv",
            "--model",
            "deepseek-r1-distill-qwen-14b",
            "--kv-dtype",
            "tq-t4nc",
            "--context",
            "8192",
        ],
        capsys,
    )
    assert data["kv_dtype"] == "tq4"
    assert data["kv_bytes_per_token"] == 52_224
    assert data["kv_cache_bytes"] == 427_819_008


def test_kv_mla_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # 61 x (512 + 64) x 1 byte = 35,136.
    data = run_json(
        [
            "plan",
            "kv",
            "--layers",
            "61",
            "--kv-lora-rank",
            "512",
            "--rope-head-dim",
            "64",
            "--kv-dtype",
            "fp8",
        ],
        capsys,
    )
    assert data["mla"] is True
    assert data["kv_bytes_per_token"] == 35_136


@pytest.mark.parametrize("as_directory", [False, True])
def test_kv_from_hf_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_directory: bool
) -> None:
    model_dir = tmp_path / "Phi-4-mini-instruct"
    model_dir.mkdir()
    config = {
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
    }
    (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    target = model_dir if as_directory else model_dir / "config.json"
    data = run_json(["plan", "kv", "--hf-config", str(target)], capsys)
    assert data["model"] == "Phi-4-mini-instruct"
    assert data["head_dim"] == 128  # 3072 / 24
    assert data["kv_bytes_per_token"] == 131_072


def test_kv_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        ["plan", "kv", "--model", "qwen3-30b-a3b", "--kv-dtype", "fp16", "--context", "16384"],
        capsys,
    )
    assert (code, err) == (0, "")
    assert "kv_bytes_per_token  98,304 (96.00 KiB)" in out
    assert "1,610,612,736 (1.50 GiB) for 16,384 tokens x 1 seq(s)" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["plan", "kv", "--model", "qwen3-8b", "--kv-dtype", "fp7"], "unknown KV dtype 'fp7'"),
        (["plan", "kv", "--layers", "32", "--kv-heads", "8"], "--head-dim required"),
        (["plan", "kv", "--kv-heads", "8", "--head-dim", "128"], "--layers is required"),
        (["plan", "kv"], "describe the model"),
        (["plan", "kv", "--model", "qwen3-8b", "--layers", "3"], "give only one of"),
        (["plan", "kv", "--model", "nope"], "unknown model 'nope'"),
        (["plan", "kv", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"], "layers"),
        (["plan", "kv", "--layers", "4", "--kv-lora-rank", "512"], "MLA needs both"),
        (["plan", "kv", "--model", "qwen3-8b", "--context", "-1"], "context tokens"),
        (["plan", "kv", "--model", "qwen3-8b", "--seqs", "4"], "--seqs needs --context"),
        (
            ["plan", "kv", "--model", "deepseek-v3", "--kv-dtype", "tq3k4v"],
            "MLA caches one shared latent",
        ),
    ],
)
def test_kv_bad_input(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_bad_input(argv, capsys, fragment)


def test_hf_config_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_bad_input(
        ["plan", "kv", "--hf-config", str(tmp_path / "missing.json")], capsys, "file not found"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    assert_bad_input(["plan", "kv", "--hf-config", str(broken)], capsys, "is not valid JSON")
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]", encoding="utf-8")
    assert_bad_input(["plan", "kv", "--hf-config", str(listing)], capsys, "JSON object")
    empty = tmp_path / "empty.json"
    empty.write_text("{}", encoding="utf-8")
    assert_bad_input(["plan", "kv", "--hf-config", str(empty)], capsys, "no num_hidden_layers")


# ---------------------------------------------------------------- plan context


def test_context_kaito_a10_example(capsys: pytest.CaptureFixture[str]) -> None:
    # See test_planner_context: (24 x 0.84 - 7.15 x 1.02 - 2.3) x 8,192 = 86,564 -> 86,528.
    data = run_json(
        [
            "plan",
            "context",
            "--gpu-gib",
            "24",
            "--weights-gib",
            "7.15",
            "--bytes-per-token",
            "131072",
            "--model-limit",
            "131072",
        ],
        capsys,
    )
    assert data["max_context_tokens"] == 86_528
    assert data["raw_tokens"] == 86_564
    assert data["clamped"] is False
    assert data["kv_shards"] == 1
    assert data["remaining_gib_per_gpu"] == pytest.approx(10.567)


def test_context_from_catalog_model_with_kaito_2139_overhead(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The catalog gives Phi-4-mini's 131,072 B/token (bf16) and its 131,072-token limit.
    data = run_json(
        [
            "plan",
            "context",
            "--gpu-gib",
            "24",
            "--weights-gib",
            "7.15",
            "--model",
            "phi-4-mini",
            "--overhead-weight-fraction",
            "0.05",
        ],
        capsys,
    )
    assert data["max_context_tokens"] == 83_456
    assert data["model_limit"] == 131_072


def test_context_clamps_and_derives_weights_from_params(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Phi-4-mini from the catalog: 3.84e9 x 2 bytes = 7.15 GiB; on 80 GiB it is clamped.
    data = run_json(["plan", "context", "--gpu-gib", "80", "--model", "phi-4-mini"], capsys)
    assert data["max_context_tokens"] == 131_072
    assert data["clamped"] is True
    assert data["weights_source"] == "3.84B params as bf16"
    assert data["weights_gib"] == pytest.approx(7.153, abs=0.001)


def test_context_with_no_room_exits_zero_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        [
            "plan",
            "context",
            "--gpu-gib",
            "24",
            "--weights-gib",
            "20",
            "--bytes-per-token",
            "131072",
        ],
        capsys,
    )
    assert data["max_context_tokens"] == 0
    assert data["reason"].startswith("no memory left for the KV cache")


def test_context_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["plan", "context", "--gpu-gib", "24", "--weights-gib", "7.15", "--model", "phi-4-mini"],
        capsys,
    )
    assert code == 0
    assert out.startswith("max_context_tokens   86,528\n")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--weights-gib", "7", "--bytes-per-token", "0"], "KV bytes per token"),
        (["--weights-gib", "-7", "--bytes-per-token", "1024"], "weights must be a positive"),
        (["--bytes-per-token", "1024"], "give --weights-gib, or --params-b"),
        (["--weights-gib", "7"], "describe the model"),
        (["--weights-gib", "7", "--params-b", "3", "--bytes-per-token", "9"], "not both"),
        (
            ["--params-b", "3", "--weight-dtype", "int3", "--bytes-per-token", "9"],
            "unknown weight dtype",
        ),
        (["--weights-gib", "7", "--bytes-per-token", "9", "--utilization", "1.2"], "<= 1"),
        (["--weights-gib", "7", "--bytes-per-token", "9", "--gpus", "0"], "GPU count"),
    ],
)
def test_context_bad_input(
    extra: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_bad_input(["plan", "context", "--gpu-gib", "24", *extra], capsys, fragment)


# ---------------------------------------------------------------- plan gpus


def test_gpus_for_llama_70b_at_full_context(capsys: pytest.CaptureFixture[str]) -> None:
    # 70.6e9 x 2 = 131.5 GiB x 1.02; KV 131,072 x 327,680 = 40 GiB split over min(N, 8) GPUs.
    # N=2: 67.06 + 2.3 + 20 > 67.2; N=3: 44.71 + 2.3 + 13.33 = 60.34 <= 67.2, but 3 does not
    # divide the 64 attention heads (vLLM refuses it). Two GPUs per node: tensor parallel 2 in
    # each x 2 pipeline stages: 134.1 / 4 = 33.53 + 2.3 + 40 / (2 x 2) = 45.83 GiB per GPU.
    data = run_json(
        [
            "plan",
            "gpus",
            "--gpu-gib",
            "80",
            "--model",
            "llama-3.1-70b",
            "--context",
            "131072",
            "--gpus-per-node",
            "2",
        ],
        capsys,
    )
    assert (data["min_gpus"], data["min_nodes"], data["fits"]) == (4, 2, True)
    assert (data["tensor_parallel_size"], data["pipeline_parallel_size"]) == (2, 2)
    assert data["needed_gib_per_gpu"] == pytest.approx(45.83, abs=0.01)


def test_gpus_for_llama_70b_is_a_divisor_of_its_heads(capsys: pytest.CaptureFixture[str]) -> None:
    # The case: 3 GPUs hold 131.5 GiB (x 1.02) on 80 GiB GPUs, but tensor parallelism
    # must divide the 64 attention heads: 4 (ModelConfig.verify_with_parallel_config).
    argv = ["plan", "gpus", "--gpu-gib", "80", "--model", "llama-3.1-70b", "--context", "8192"]
    data = run_json(argv, capsys)
    assert data["min_gpus"] == 4  # the old planner said 3
    assert (data["min_nodes"], data["memory_gpus"]) == (1, 3)
    assert (data["tensor_parallel_size"], data["attention_heads"]) == (4, 64)
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert "vllm flags  --tensor-parallel-size 4\n" in out
    assert (
        "why         3 GPU(s) hold it; tensor parallelism needs a divisor of 64 heads: 4 (" in out
    )
    # --attention-heads overrides the model's (48 heads: 3 divides them).
    data = run_json([*argv, "--attention-heads", "48"], capsys)
    assert data["min_gpus"] == 3


def test_context_warns_of_a_tensor_parallel_size_vllm_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "context", "--gpu-gib", "80", "--model", "llama-3.1-70b", "--gpus", "3"]
    data = run_json(argv, capsys)
    assert (data["attention_heads"], data["tensor_parallel_ok"]) == (64, False)
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert "vLLM refuses --tensor-parallel-size 3: it does not divide the model's 64" in out
    assert run_json([*argv[:-1], "4"], capsys)["tensor_parallel_ok"] is True


def test_gpus_when_nothing_fits(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        [
            "plan",
            "gpus",
            "--gpu-gib",
            "80",
            "--weights-gib",
            "642",
            "--model",
            "deepseek-v3",
            "--context",
            "1000000",
        ],
        capsys,
        code=1,
    )
    assert data["fits"] is False
    assert data["min_gpus"] is None
    assert data["min_nodes"] is None
    assert "nothing fits at any GPU count" in data["reason"]


def test_gpus_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert_bad_input(
        [
            "plan",
            "gpus",
            "--gpu-gib",
            "80",
            "--weights-gib",
            "10",
            "--bytes-per-token",
            "1024",
            "--gpus-per-node",
            "0",
        ],
        capsys,
        "GPUs per node",
    )


# ---------------------------------------------------------------- plan share

# The article ran vLLM 0.19: its orchestrator's graphs came on top of the budget.
ARTICLE_A = "name=A,weights-gib=6.4,kv-gib=1.6,graphs-gib=8,overhead-gib=4.7,graphs-outside-budget"
ARTICLE_B = "name=B,weights-gib=9.4,kv-gib=1,eager"


def test_share_cli_example(capsys: pytest.CaptureFixture[str]) -> None:
    # See test_planner_share: A takes 0.40 and 21.236 GiB, B is 1.3 GiB short.
    data = run_json(
        ["plan", "share", "--gpu-gib", "31.84", "--instance", ARTICLE_A, "--instance", ARTICLE_B],
        capsys,
        code=1,  # it does not fit
    )
    first, second = data["instances"]
    assert first["gpu_memory_utilization"] == 0.4
    assert first["flags"] == ["--gpu-memory-utilization", "0.40"]
    assert "kv_cache_memory_bytes" not in first
    assert first["expected_used_gib"] == pytest.approx(21.236)
    assert second["ok"] is False
    assert second["expected_used_gib"] == 0.0
    assert data["fits"] is False
    assert data["free_gib"] == pytest.approx(10.604)


def test_share_with_eager_orchestrator_fits(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        [
            "plan",
            "share",
            "--gpu-gib",
            "31.84",
            "--instance",
            ARTICLE_A + ",eager",
            "--instance",
            ARTICLE_B,
        ],
        capsys,
    )
    assert data["fits"] is True
    assert [item["flags"] for item in data["instances"]] == [
        ["--gpu-memory-utilization", "0.40", "--enforce-eager"],
        ["--gpu-memory-utilization", "0.36", "--enforce-eager"],
    ]
    assert data["free_gib"] == pytest.approx(31.84 - 13.236 - 11.962, abs=0.001)


def test_share_legacy_accounting_uses_kv_cache_memory_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(
        [
            "plan",
            "share",
            "--gpu-gib",
            "31.84",
            "--baseline-gib",
            "15.16",
            "--legacy-accounting",
            "--instance",
            ARTICLE_B,
        ],
        capsys,
    )
    (item,) = data["instances"]
    assert item["ok"] is True
    assert item["kv_cache_memory_bytes"] == 1_073_741_824
    assert "--kv-cache-memory-bytes" in item["flags"]
    assert item["notes"]


def test_share_pinned_utilization_reproduces_attempt_1(capsys: pytest.CaptureFixture[str]) -> None:
    # 31.84 - 23.04 = 8.8 GiB free; 0.35 x 31.84 = 11.14 GiB requested -> refused.
    data = run_json(
        [
            "plan",
            "share",
            "--gpu-gib",
            "31.84",
            "--baseline-gib",
            "23.04",
            "--instance",
            ARTICLE_B + ",util=0.35,cuda-context-gib=0",
        ],
        capsys,
        code=1,  # refused at start-up: it does not fit
    )
    (item,) = data["instances"]
    assert item["ok"] is False
    assert item["flags"][:2] == ["--gpu-memory-utilization", "0.35"]
    assert item["problems"][0].startswith("start-up check fails: 8.80 GiB free")
    assert item["requested_gib"] == pytest.approx(11.144)


def test_share_kv_bytes_flag_forces_the_mode(capsys: pytest.CaptureFixture[str]) -> None:
    # Footprint 0.5 + 9.4 + 1 + 1 = 11.9 GiB on an empty 31.84 GiB GPU:
    # U = floor(11.4 / 31.84 = 0.358) = 0.35 only has to pass the start-up check.
    data = run_json(
        ["plan", "share", "--gpu-gib", "31.84", "--instance", ARTICLE_B + ",kv-bytes"], capsys
    )
    (item,) = data["instances"]
    assert item["mode"] == "kv-bytes"
    assert item["kv_cache_memory_bytes"] == 1_073_741_824
    assert item["gpu_memory_utilization"] == 0.35
    assert item["expected_used_gib"] == pytest.approx(11.9)


def test_share_kv_budget_from_context_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    # qwen3-8b at tq4: 39,168 B/token x 40,960 tokens = 1,604,321,280 B = 1.494 GiB of KV;
    # AWQ weights from the catalog's 8.2e9 parameters (5.68 GiB).
    data = run_json(
        [
            "plan",
            "share",
            "--gpu-gib",
            "32",
            "--instance",
            "name=orch,model=qwen3-8b,weight-dtype=awq,context=40960,kv-dtype=tq4",
        ],
        capsys,
    )
    (item,) = data["instances"]
    assert item["ok"] is True
    assert item["kv_cache_gib"] >= 1.494
    # U = ceil((5.684 + 1.0 + 1.494) / 32 = 0.2556) = 0.26.
    assert item["gpu_memory_utilization"] == 0.26


def test_share_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["plan", "share", "--gpu-gib", "31.84", "--instance", ARTICLE_A, "--instance", ARTICLE_B],
        capsys,
    )
    assert code == 1  # the plan is printed, and it does not fit
    assert "A: vllm serve ... --gpu-memory-utilization 0.40" in out
    assert "  advice: instances started before it hold 8.00 GiB of CUDA graphs" in out
    assert out.rstrip().endswith("free at the end: 10.60 GiB; fits: NO")


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("name=A,weights-gib=x,kv-gib=1", "weights-gib must be a number"),
        ("name=A,weights=1,kv-gib=1", "unknown key 'weights'"),
        ("name=A,weights-gib=1,kv-gib=1,fast", "'fast' is not a known flag"),
        ("name=A,kv-gib=1", "give weights-gib, params-b or a catalog model"),
        ("name=A,weights-gib=1", "give kv-gib, or context"),
        ("name=A,weights-gib=1,context=4096", "bytes-per-token or a catalog model"),
        ("name=A,weights-gib=1,kv-gib=1,mode=sometimes", "mode must be one of"),
        ("name=A,weights-gib=1,kv-gib=1,util=1.5", "gpu_memory_utilization must be <= 1"),
        ("name=A,weights-gib=-1,kv-gib=1", "weights must be a positive"),
        ("name=A,weights-gib=1,weights-gib=2,kv-gib=1", "weights-gib given twice"),
    ],
)
def test_share_bad_instance(spec: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_bad_input(["plan", "share", "--gpu-gib", "24", "--instance", spec], capsys, fragment)


def test_share_duplicate_names(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "name=A,weights-gib=1,kv-gib=1"
    assert_bad_input(
        ["plan", "share", "--gpu-gib", "24", "--instance", spec, "--instance", spec],
        capsys,
        "unique",
    )


# ---------------------------------------------------------------- argparse itself


@pytest.mark.parametrize(
    "argv",
    [
        ["plan"],
        ["plan", "share", "--instance", ARTICLE_B],  # --gpu-gib missing
        ["plan", "context", "--gpu-gib", "lots"],
        ["plan", "kv", "--layers", "many"],
    ],
)
def test_argparse_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        build_parser().parse_args(argv)
    assert excinfo.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_every_sub_command_sets_a_handler() -> None:
    parser = build_parser()
    for argv in (
        ["plan", "kv", "--model", "qwen3-8b"],
        ["plan", "context", "--gpu-gib", "24", "--model", "qwen3-8b"],
        ["plan", "gpus", "--gpu-gib", "24", "--model", "qwen3-8b"],
        ["plan", "share", "--gpu-gib", "24", "--instance", ARTICLE_B],
    ):
        args = parser.parse_args(argv)
        assert callable(args.func)
        assert args.func.__name__.startswith("run_")


def test_share_with_a_context_applies_vllms_one_request_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # qwen3-8b bf16: 147,456 B/token; one request of 16,384 tokens (1,024 blocks + the null
    # block) = 2.25 GiB. At 0.75 of 24 GiB the KV cache gets 18 - 15.27 - 1 = 1.73 GiB: vLLM
    # refuses to start, so the instance does not come up.
    spec = "name=a,model=qwen3-8b,context=16384,util=0.75"
    data = run_json(["plan", "share", "--gpu-gib", "24", "--instance", spec], capsys, code=1)
    (item,) = data["instances"]
    assert (item["ok"], item["runs"]) == (False, False)
    assert (
        "less than the 2.25 GiB one request of max_model_len 16384 tokens needs"
        in (item["problems"][0])
    )
    # Chosen by the planner, it holds one request; concurrency is vLLM's figure.
    spec = "name=a,model=qwen3-8b,context=16384"
    data = run_json(["plan", "share", "--gpu-gib", "24", "--instance", spec], capsys)
    (item,) = data["instances"]
    assert item["ok"] is True
    assert item["max_concurrency"] >= 1.0
    code, out, _ = run(["plan", "share", "--gpu-gib", "24", "--instance", spec], capsys)
    assert code == 0
    assert "maximum concurrency " in out

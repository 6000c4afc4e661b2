"""The vLLM 0.33 start-up and failure tables (app.upstreams.vllm_output) against lines
built here from vLLM's own format strings (copied from the vllm package, file:line), with
vLLM's log prefix (vllm/logger.py _FORMAT, _DATE_FORMAT "%m-%d %H:%M:%S")."""

from __future__ import annotations

import pytest

from app.runtimes.output import LineSplitter
from app.upstreams.vllm_output import (
    FAILURES,
    MAX_QUOTE,
    MILESTONES,
    LoadTracker,
    diagnose,
    explain,
    loaded_weights_gib,
    message,
    progress_of,
)

# vllm/logger.py: "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
# [%(fileinfo)s:%(lineno)d] %(message)s"
LOG = "({proc} pid={pid}) {level} 11-26 07:50:01 [{where}] {message}"
# model_executor/model_loader/weight_utils.py:842
BAR = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"  # noqa: E501


def log(fmt: str, *args: object, where: str = "x.py:1", proc: str = "EngineCore_DP0") -> str:
    return LOG.format(proc=proc, pid=4242, level="INFO", where=where, message=fmt % args)


# (format string as in vLLM 0.33, its arguments, the phase it marks)
PHASE_LINES = [
    (
        "Starting to load model %s...",
        ("Qwen/Qwen3-8B",),
        "loading_model",
    ),  # gpu_model_runner.py:4979
    ("Loading weights took %.2f seconds", (12.3456,), "loading_weights"),  # default_loader.py:507
    ("Model loading took %s GiB memory and %.6f seconds", ("15.27", 13.5), "profiling"),  # :5089
    ("Available KV cache memory: %s GiB", ("5.61",), "allocating_kv_cache"),  # gpu_worker.py:773
    (
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
        ("GPU", f"{123456:,}", f"{32768:,}", 3.77),
        "allocating_kv_cache",
    ),  # kv_cache_utils.py:1148
    ("Graph capturing finished in %.0f secs, took %.2f GiB", (7.4, 0.54), "warming_up"),  # :6517
    (
        "init engine (profile, create kv cache, warmup model) took %.2f s",
        (41.2,),
        "starting_server",
    ),  # v1/engine/core.py:413
    ("Starting vLLM server on %s", ("http://0.0.0.0:8000",), "starting_server"),  # entry.py:139
]


@pytest.mark.parametrize(
    ("fmt", "args", "phase"), PHASE_LINES, ids=[p[0][:30] for p in PHASE_LINES]
)
def test_each_milestone_line_is_recognised_with_and_without_the_prefix(
    fmt: str, args: tuple[object, ...], phase: str
) -> None:
    line = log(fmt, *args)
    progress = progress_of(line)
    assert progress is not None
    assert progress.phase == phase
    assert progress_of(fmt % args) == progress  # no prefix (another logging config)
    assert message(line) == fmt % args


def test_the_kv_cache_size_keeps_its_thousands_separators() -> None:
    line = log("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: "
               "%.2fx", "GPU", f"{1234567:,}", f"{131072:,}", 9.42)  # fmt: skip
    found = MILESTONES[5].pattern.search(message(line))
    assert found is not None
    assert found.group("tokens") == "1,234,567"


def test_the_weight_shards_bar_moves_the_percent_within_its_span() -> None:
    bars = [
        BAR.format(desc="Loading safetensors checkpoint shards", percentage=100 * n / 4,
                   n_fmt=n, total_fmt=4, elapsed="00:01", remaining="00:02",
                   rate_fmt="1.52it/s")
        for n in range(5)
    ]  # fmt: skip
    percents = []
    for bar in bars:
        progress = progress_of(bar)
        assert progress is not None
        assert progress.phase == "loading_weights"
        percents.append(progress.percent)
    assert percents == [10, 25, 40, 55, 70]


def test_tqdm_carriage_returns_feed_the_tracker_update_by_update() -> None:
    # gpu_model_runner.py:6592, tqdm's default bar: "\r" before each update, "\n" at close.
    desc = "Capturing CUDA graphs ({}, {})".format("mixed prefill-decode", "PIECEWISE")
    stream = "".join(f"\r{desc}: {p:3.0f}%|{'#' * (p // 10):<10}| {p}/100 [00:01<00:00]"
                     for p in (0, 50, 100)) + "\n"  # fmt: skip
    splitter, tracker, seen = LineSplitter(), LoadTracker(), []
    for byte in stream.encode():  # cut anywhere
        for line in splitter.feed(bytes([byte])):
            tracker.feed(line)
            seen.append(tracker.progress)
    assert [p.phase for p in seen] == ["capturing_graphs"] * 3
    assert [p.percent for p in seen] == [80, 87, 95]


def test_the_percent_never_goes_back() -> None:
    tracker = LoadTracker()
    tracker.feed(log("Available KV cache memory: %s GiB", "5.6"))
    assert tracker.feed(log("Starting to load model %s...", "m"))  # the phase moved
    assert tracker.progress.phase == "loading_model"
    assert tracker.progress.percent == 78
    assert not tracker.feed("an unrelated line")


KV = (
    "To serve at least one request with the model's max seq len ({}), ({} GiB KV cache is "
    "needed, which is larger than the available KV cache memory ({} GiB). Based on the "
    "available memory, the estimated maximum model length is {}. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
    "decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)  # v1/core/kv_cache_planning.py:78

FAILURE_LINES = [
    ("kv_cache_too_small", "ValueError: " + KV.format(32768, "4.0", "1.2", 9808)),
    ("no_kv_memory", "ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine"),  # kv_cache_planning.py:58
    ("gpu_memory_utilization_too_high", "ValueError: Free memory on device cuda:0 "
     "(10.2/23.55 GiB) on startup is less than desired GPU memory utilization (0.9, "
     "21.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
     "processes."),  # v1/worker/utils.py:766
    ("load_out_of_memory", "Failed to load model - not enough GPU memory. Try lowering "
     "--gpu-memory-utilization to free memory for weights, increasing "
     "--tensor-parallel-size, or using --quantization. (original error: CUDA out of "
     "memory. Tried to allocate 2.00 GiB)"),  # gpu_model_runner.py:5079
    ("cuda_out_of_memory", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
     "1.50 GiB. GPU 0 has a total capacity of 23.55 GiB"),
    ("model_not_found", "ValueError: Invalid repository ID or local directory specified: "
     "'Qwen/Nope'."),  # transformers_utils/config.py:912
    ("unsupported_architecture", "ValueError: Model architectures ['FooForCausalLM'] are "
     "not supported for now. Supported architectures: dict_keys([...])"),  # registry.py:1250
    ("port_in_use", "OSError: [Errno 98] Address already in use"),  # launcher.py:353 bind
]  # fmt: skip


@pytest.mark.parametrize(("key", "said"), FAILURE_LINES, ids=[k for k, _ in FAILURE_LINES])
def test_each_failure_is_recognised_with_its_hint(key: str, said: str) -> None:
    lines = [log("EngineCore failed to start."), f"(EngineCore_DP0 pid=4242) {said}"]
    found = diagnose(lines)
    assert [d.key for d in found] == [key]
    assert found[0].line == said[:MAX_QUOTE] or found[0].line.endswith("...")
    hint = next(f.hint for f in FAILURES if f.key == key)
    assert found[0].hint == hint
    assert "microscheduler plan" in hint or "--" in hint  # a command or a vLLM flag


def test_only_decisive_lines_are_quoted_bounded_and_the_specific_first() -> None:
    lines = [
        log("Starting to load model %s...", "m"),
        "(EngineCore_DP0 pid=1) Traceback (most recent call last):",
        "(EngineCore_DP0 pid=1) Failed to load model - not enough GPU memory. (original "
        "error: CUDA out of memory.)",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.",
        "user prompt: tell me a secret",
    ]
    text = explain(lines)
    assert text.startswith('; it said: "Failed to load model - not enough GPU memory.')
    assert "secret" not in text
    assert "Traceback" not in text
    assert "pid=" not in text
    assert [d.key for d in diagnose(lines)] == ["load_out_of_memory"]  # not also cuda_oom
    assert explain(["nothing to see"]) == ""
    long = diagnose(["ValueError: " + KV.format(32768, "4.0", "1.2", 9808) * 3])
    assert len(long[0].line) == MAX_QUOTE


def test_every_entry_names_its_vllm_source() -> None:
    sources = [m.source for m in MILESTONES] + [f.source for f in FAILURES]
    assert all(".py:" in source for source in sources)


def test_the_weights_vllm_loaded_are_read_from_its_line() -> None:
    """vllm/v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f
    seconds" (info_once, scope local: rank 0's share of one node)."""
    line = (
        "(EngineCore_DP0 pid=7) INFO 11-26 07:50:01 [gpu_model_runner.py:5089] "
        "Model loading took 15.27 GiB memory and 3.912345 seconds"
    )
    assert loaded_weights_gib(line) == 15.27
    assert loaded_weights_gib("Available KV cache memory: 1.2 GiB") is None
    tracker = LoadTracker()
    tracker.feed(line)
    tracker.feed("(EngineCore_DP0 pid=7) INFO 11-26 07:50:02 [gpu_worker.py:773] "
                 "Available KV cache memory: 1.2 GiB")  # fmt: skip
    assert tracker.weights_gib == 15.27

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
    CompileSeen,
    LoadTracker,
    diagnose,
    explain,
    last_error,
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
        "non-default args: %s",
        ({"model_tag": "Qwen/Qwen3-8B", "model": "Qwen/Qwen3-8B", "max_model_len": 32768},),
        "resolving_config",
    ),  # entrypoints/common/startup.py:96
    ("Resolved architecture: %s", ("Qwen3ForCausalLM",), "resolving_config"),  # model.py:744
    (
        "Initializing a V1 LLM engine (v%s) with config: %s",
        ("0.33.0", "model='Qwen/Qwen3-8B', speculative_config=None, max_seq_len=32768"),
        "starting_engine",
    ),  # v1/engine/core.py:140
    (
        "Starting to load model %s...",
        ("Qwen/Qwen3-8B",),
        "loading_model",
    ),  # gpu_model_runner.py:4979
    ("Loading weights took %.2f seconds", (12.3456,), "loading_weights"),  # default_loader.py:507
    ("Model loading took %s GiB memory and %.6f seconds", ("15.27", 13.5), "profiling"),  # :5089
    ("%sStarting torch.compile", ("",), "compiling"),  # compilation/monitor.py:40
    ("%sStarting torch.compile", ("[backbone] ",), "compiling"),  # with a compile tag
    ("%sDynamo bytecode transform time: %.2f s", ("", 5.91), "compiling"),  # backends.py:1188
    ("%storch.compile took %.2f s in total", ("", 17.04), "compiling"),  # monitor.py:20,62
    (
        "%storch.compile and initial profiling/warmup run together took %.2f s in total",
        ("", 21.5),
        "compiling",
    ),  # compilation/decorators.py:716
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
    kv_size = next(m for m in MILESTONES if m.key == "kv_size")
    found = kv_size.pattern.search(message(line))
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


def test_the_milestones_percents_follow_vllms_order() -> None:
    percents = [m.percent for m in MILESTONES]
    assert percents == sorted(percents)
    assert percents[0] > 0
    keys = [m.key for m in MILESTONES]
    # API server, then engine core, then the load; torch.compile between the weights and
    # the KV cache (the profiling run compiles: v1/worker/gpu_worker.py:700).
    assert keys.index("engine_init") < keys.index("load_start")
    assert keys.index("model_loaded") < keys.index("compile_start") < keys.index("kv_memory")
    early = [m for m in MILESTONES if m.percent < MILESTONES[keys.index("load_start")].percent]
    assert [m.phase for m in early] == ["resolving_config", "resolving_config", "starting_engine"]


def test_the_progress_moves_before_the_model_loads() -> None:
    tracker = LoadTracker()
    seen = []
    for fmt, args, _ in PHASE_LINES[:3]:
        assert tracker.feed(log(fmt, *args, proc="APIServer"))
        seen.append(tracker.progress)
    assert [p.phase for p in seen] == ["resolving_config", "resolving_config", "starting_engine"]
    assert [p.percent for p in seen] == [1, 2, 3]
    tracker.feed(log("Starting to load model %s...", "m"))
    assert tracker.progress.percent == 5


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
    # config/model.py:2664, under pydantic's "ValidationError: 1 validation error for
    # ModelConfig" as "  Value error, ..."
    ("max_model_len_too_long", "Value error, User-specified max_model_len (65536) is "
     "greater than the derived max_model_len (max_position_embeddings=32768 or "
     "model_max_length=None in model's config.json). To allow overriding this maximum, set "
     "the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."),
    ("sleep_mode_unsupported", "Value error, Sleep mode is not supported on current "
     "platform. [type=value_error]"),  # config/model.py:668
    ("not_cached_offline", "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an "
     "appropriate cached snapshot folder for the specified revision on the local disk and "
     "outgoing traffic has been disabled. To enable repo look-ups and downloads online, set "
     "'HF_HUB_OFFLINE=0' as environment variable."),  # _snapshot_download.py:389
    ("not_cached_offline", "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the "
     "requested files in the disk cache and outgoing traffic has been disabled. To enable "
     "hf.co look-ups and downloads online, set 'local_files_only' to False."),
    ("no_network", "OSError: We couldn't connect to 'https://huggingface.co' to load the "
     "files, and couldn't find them in the cached files."),  # transformers/utils/hub.py:621
    ("model_not_found", "OSError: nobody/nothing is not a local folder and is not a valid "
     "model identifier listed on 'https://huggingface.co/models'"),  # transformers hub.py:570
    ("model_not_found", "huggingface_hub.errors.HFValidationError: Repo id must use "
     "alphanumeric chars, '-', '_' or '.'."),  # huggingface_hub/utils/_validators.py:140
    ("unknown_flag", "vllm serve: error: unrecognized arguments: --max-model-lenght 4096"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("key", "said"), FAILURE_LINES, ids=[f"{k}-{n}" for n, (k, _) in enumerate(FAILURE_LINES)]
)
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


def test_an_unrecognised_failure_quotes_its_last_exception_line_only() -> None:
    lines = [
        log("Starting to load model %s...", "m"),
        "(EngineCore_DP0 pid=1) Traceback (most recent call last):",
        '(EngineCore_DP0 pid=1)   File "/x/vllm/model_executor/models/llama.py", line 9, in f',
        "(EngineCore_DP0 pid=1) KeyError: 'rope_scaling'",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {}",  # v1/engine/utils.py:1470: the root cause is above
        "user prompt: tell me a secret",
    ]
    assert diagnose(lines) == []
    assert last_error(lines) == "KeyError: 'rope_scaling'"
    assert explain(lines) == "; it said: \"KeyError: 'rope_scaling'\""
    assert "secret" not in explain(lines)
    # The wrapper alone is still better than nothing.
    assert last_error(lines[-2:]) == (
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )


@pytest.mark.parametrize(
    "said",
    [
        # argparse.py ArgumentParser.error: "%(prog)s: error: %(message)s"
        "vllm serve: error: argument --dtype: invalid choice: 'fp77' (choose from auto, "
        "bfloat16, float, float16, float32, half)",
        "huggingface_hub.errors.EntryNotFoundError: 404 Client Error.",
        "torch.distributed.DistBackendError: NCCL error in: ../init.cpp:1",
        "Value error, Invalid value for --kv-cache-dtype [type=value_error]",  # pydantic
    ],
)
def test_exception_and_argparse_error_lines_are_the_fallback(said: str) -> None:
    assert explain([log("non-default args: %s", {}), said, "something after it"]) == (
        f'; it said: "{said}"'
    )


def test_the_fallback_quotes_no_other_line_and_is_bounded() -> None:
    # A warning naming an exception mid-line is no exception (real: system_utils.py:255).
    warning = log("Found ulimit of 20000 and failed to automatically increase with error "
                  "current limit exceeds maximum limit. This can cause fd limit errors like "
                  "`OSError: [Errno 24] Too many open files`. Consider increasing with "
                  "ulimit -n")  # fmt: skip
    assert explain([warning, "Traceback (most recent call last):", "exit 1"]) == ""
    long = "ValueError: " + "x" * 2 * MAX_QUOTE
    found = last_error([long])
    assert found is not None
    assert len(found) == MAX_QUOTE
    # A recognised line wins: no fallback quote besides it.
    lines = ["KeyError: 'x'", "OSError: [Errno 98] Address already in use"]
    assert explain(lines).count("it said") == 1
    assert "KeyError" not in explain(lines)


def compile_after(*lines: str) -> CompileSeen:
    tracker = LoadTracker()
    for line in lines:
        tracker.feed(f"(EngineCore_DP0 pid=7) INFO 11-29 08:00:00 [backends.py:1] {line}")
    return tracker.compile


def test_a_starts_compile_seconds_and_whether_the_cache_served_it() -> None:
    """vLLM's lines, from their format strings (compilation/backends.py:310, :417, :1123;
    compilation/decorators.py:326; compilation/monitor.py:20)."""
    hit = (
        "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, "
        "took 0.412 s"
    )
    miss = "Compiling a graph for compile range (1, 8192) takes 6.81 s"
    assert compile_after() == CompileSeen(None, None)
    assert compile_after(hit, "torch.compile took 5.02 s in total") == CompileSeen(5.02, "hit")
    assert compile_after("[backbone] " + miss).cache == "miss"
    assert compile_after(miss, hit).cache == "miss"  # one graph compiled: not all cached
    assert compile_after(hit, miss).cache == "miss"
    assert compile_after("Directly load AOT compilation from path /c/x").cache == "hit"
    off = "vLLM's torch.compile cache is disabled."
    assert compile_after(off, miss).cache == "off"
    # One line per compiled part (an encoder's, a decoder's): their sum.
    two = compile_after(
        "[encoder] torch.compile took 1.50 s in total", "torch.compile took 2.25 s in total"
    )
    assert two.seconds == pytest.approx(3.75)

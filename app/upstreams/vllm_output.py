"""What vLLM 0.33 writes while it starts, and the lines that say why a start failed: two
tables, pure (no I/O).

A vLLM log line is `(EngineCore_DP0 pid=N) INFO 11-26 07:50:01 [file.py:line] message`
(`vllm/logger.py`, `_FORMAT` and `_DATE_FORMAT`); `message()` strips that prefix, which
may be absent (tqdm bars, tracebacks, other servers). Every entry of both tables names
the file of the vllm package its wording comes from (0.33.0), so that a new vLLM version
is checked against one place.

- `MILESTONES`: the start-up phases in order, each with the share of a load it marks
  (`percent`). A tqdm bar (`bar=True`: weight shards, CUDA-graph capture) carries its own
  percentage, spread over its span up to the next milestone. `LoadTracker` follows them;
  its percent never goes back (vLLM captures graphs in two passes).
- `FAILURES`: lines that explain a failed start, each with a hint naming the
  `microscheduler plan ...` command or vLLM flag that fixes it. `diagnose()` picks the
  decisive ones from a start's last lines. Only these recognised lines, cut to
  `MAX_QUOTE` characters, ever leave the backend's output (in errors and `/status`):
  the output itself may hold prompts and is shown to admins only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

MAX_QUOTE: Final = 400  # characters of a quoted line
MAX_DIAGNOSES: Final = 2

# `vllm/logger.py`: _FORMAT "(%(vllm_process_name)s pid=%(process)d) %(levelname)s
# %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s", _DATE_FORMAT "%m-%d %H:%M:%S".
_PREFIX = re.compile(
    r"^(?:\((?P<process>[^()\s]+) pid=\d+\) )?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"\[[^\]]+:\d+\] )?"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # vLLM colours its level names on a terminal


def message(line: str) -> str:
    """The message of a vLLM log line: without colours and the process/level/time/file
    prefix (a line without one is returned stripped)."""
    text = _ANSI.sub("", line).strip()
    return text[_PREFIX.match(text).end() :]  # type: ignore[union-attr]  # always matches


# -- start-up phases -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Milestone:
    key: str
    phase: str  # what `/status` shows as `load.phase` from this line on
    percent: int  # share of the load done when this line appears
    fmt: str  # vLLM's format string (a tqdm bar: its description and bar format)
    source: str  # where in the vllm package
    pattern: re.Pattern[str]  # matched against `message(line)`
    bar: bool = False  # a tqdm bar: `pattern` captures its percentage as `pct`


MILESTONES: Final[tuple[Milestone, ...]] = (
    Milestone(
        "load_start", "loading_model", 5,
        "Starting to load model %s...",
        "v1/worker/gpu_model_runner.py:4979",
        re.compile(r"^Starting to load model (?P<model>.+)\.\.\.$"),
    ),
    Milestone(
        "weight_shards", "loading_weights", 10,
        # _BAR_FORMAT: "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]"
        "Loading safetensors checkpoint shards: {percentage:3.0f}% Completed | "
        "{n_fmt}/{total_fmt}",
        "model_executor/model_loader/weight_utils.py:842,1130",
        re.compile(
            r"^Loading (?:safetensors|pt|np_cache) checkpoint shards(?: \(eager\))?:\s*"
            r"(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+)"
        ),
        bar=True,
    ),
    Milestone(
        "weights_loaded", "loading_weights", 70,
        "Loading weights took %.2f seconds",
        "model_executor/model_loader/default_loader.py:507",
        re.compile(r"^Loading weights took (?P<s>[\d.]+) seconds"),
    ),
    Milestone(
        "model_loaded", "profiling", 72,
        "Model loading took %s GiB memory and %.6f seconds",
        "v1/worker/gpu_model_runner.py:5089",
        re.compile(r"^Model loading took (?P<gib>[\d.]+) GiB memory and (?P<s>[\d.]+) seconds"),
    ),
    Milestone(
        "kv_memory", "allocating_kv_cache", 78,
        "Available KV cache memory: %s GiB",
        "v1/worker/gpu_worker.py:773",
        re.compile(r"^Available KV cache memory: (?P<gib>[\d.]+) GiB"),
    ),
    Milestone(
        "kv_size", "allocating_kv_cache", 80,
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
        "v1/core/kv_cache_utils.py:1148",
        re.compile(r"^(?P<pool>\S+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens"),
    ),
    Milestone(
        "graphs", "capturing_graphs", 80,
        # tqdm's default bar: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [...]"
        "Capturing CUDA graphs ({}, {}): {percentage:3.0f}%|",
        "v1/worker/gpu_model_runner.py:6592",
        re.compile(r"^Capturing CUDA graphs \((?P<what>[^)]*)\):\s*(?P<pct>\d+)%\|"),
        bar=True,
    ),
    Milestone(
        "graphs_done", "warming_up", 95,
        "Graph capturing finished in %.0f secs, took %.2f GiB",
        "v1/worker/gpu_model_runner.py:6517",
        re.compile(r"^Graph capturing finished in (?P<s>\d+) secs, took (?P<gib>[\d.]+) GiB"),
    ),
    Milestone(
        "engine_ready", "starting_server", 97,
        "init engine (profile, create kv cache, warmup model) took %.2f s",
        "v1/engine/core.py:413",
        re.compile(r"^init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s"),
    ),
    Milestone(
        "server", "starting_server", 99,
        "Starting vLLM server on %s",
        "entrypoints/launchers/api_server/entry.py:139",
        re.compile(r"^Starting vLLM server on (?P<address>\S+)"),
    ),
)  # fmt: skip

LAUNCHING: Final = "launching"  # the phase before any line is recognised


@dataclass(frozen=True, slots=True)
class LoadProgress:
    phase: str
    percent: int


def _bar_span(index: int) -> tuple[int, int]:
    """A bar's percent span: from its milestone to the next one's."""
    start = MILESTONES[index].percent
    following = MILESTONES[index + 1].percent if index + 1 < len(MILESTONES) else 100
    if following <= start:  # the graphs bar: up to the milestone after it
        following = next((m.percent for m in MILESTONES[index + 1 :] if m.percent > start), 100)
    return start, following


_MODEL_LOADED: Final = next(m.pattern for m in MILESTONES if m.key == "model_loaded")


def progress_of(text: str) -> LoadProgress | None:
    """The progress one line (or one `\\r` segment of a tqdm bar) shows; None when it is
    none of the milestones."""
    said = message(text)
    for index, milestone in enumerate(MILESTONES):
        found = milestone.pattern.search(said)
        if found is None:
            continue
        if not milestone.bar:
            return LoadProgress(milestone.phase, milestone.percent)
        start, end = _bar_span(index)
        pct = min(100, int(found.group("pct")))
        return LoadProgress(milestone.phase, start + (end - start) * pct // 100)
    return None


def loaded_weights_gib(text: str) -> float | None:
    """The GiB vLLM says its weights took on a GPU ("Model loading took X GiB memory";
    vllm/v1/worker/gpu_model_runner.py logs it with `info_once`, scope "local": once per
    node, rank 0's share, so a backend's weights are that times its GPUs)."""
    found = _MODEL_LOADED.search(message(text))
    return None if found is None else float(found.group("gib"))


class LoadTracker:
    """The progress of one start, from the lines it writes. Its phase follows the newest
    milestone; its percent never goes back."""

    def __init__(self) -> None:
        self.progress = LoadProgress(LAUNCHING, 0)
        self.lines = 0  # milestones seen
        self.weights_gib: float | None = None  # "Model loading took X GiB": one GPU's

    def feed(self, text: str) -> bool:
        """One line or `\\r` segment; True when the progress changed."""
        seen = progress_of(text)
        if seen is None:
            return False
        self.weights_gib = loaded_weights_gib(text) or self.weights_gib
        self.lines += 1
        new = LoadProgress(seen.phase, max(seen.percent, self.progress.percent))
        changed = new != self.progress
        self.progress = new
        return changed


# -- why a start failed ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    key: str
    wording: str  # the start of vLLM's message, as in its source
    source: str  # where in the vllm package (or the library it surfaces from)
    pattern: re.Pattern[str]  # searched in `message(line)`
    hint: str  # what fixes it: a `microscheduler plan ...` command or a vLLM flag


FAILURES: Final[tuple[Failure, ...]] = (
    Failure(
        "kv_cache_too_small",
        "To serve at least one request with the model's max seq len (%d), (%s GiB KV cache "
        "is needed, which is larger than the available KV cache memory (%s GiB).",
        "v1/core/kv_cache_planning.py:78",
        re.compile(r"To serve at least one request with the model's max seq len"),
        "the KV cache for one request of --max-model-len tokens does not fit: lower "
        "--max-model-len (`microscheduler plan context` gives the longest that fits) or "
        "raise --gpu-memory-utilization (`microscheduler plan profile` checks the GPU's share)",
    ),
    Failure(
        "no_kv_memory",
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "v1/core/kv_cache_planning.py:58",
        re.compile(r"No available memory for the cache blocks"),
        "the weights and activations take the whole --gpu-memory-utilization budget: raise "
        "it (`microscheduler plan share` sizes it), or `microscheduler plan gpus` for the "
        "GPUs the model needs",
    ),
    Failure(
        "gpu_memory_utilization_too_high",
        "Free memory on device %s (%s/%s GiB) on startup is less than desired GPU memory "
        "utilization (%s, %s GiB).",
        "v1/worker/utils.py:766",
        re.compile(
            r"Free memory on device .* is less than (?:desired GPU memory utilization|"
            r"the engine's budget)"
        ),
        "other processes hold the GPU memory this --gpu-memory-utilization asks for: lower it "
        "(`microscheduler plan share --baseline-gib ...` sizes it next to them) or stop them",
    ),
    Failure(
        "load_out_of_memory",
        "Failed to load model - not enough GPU memory.",
        "v1/worker/gpu_model_runner.py:5079",
        re.compile(r"Failed to load model - not enough GPU memory"),
        "the weights do not fit: lower --gpu-memory-utilization of the models sharing the GPU, "
        "use --quantization, or more GPUs (`microscheduler plan gpus`, "
        "--tensor-parallel-size)",
    ),
    Failure(
        "cuda_out_of_memory",
        "CUDA out of memory (torch.OutOfMemoryError; vLLM's own: 'CUDA out of memory "
        "occurred when warming up sampler')",
        "v1/worker/gpu_model_runner.py:5930",
        re.compile(r"CUDA out of memory"),
        "lower --max-num-seqs or --gpu-memory-utilization (`microscheduler plan profile` "
        "checks what the GPU's models need together)",
    ),
    Failure(
        "model_not_found",
        "Invalid repository ID or local directory specified: '%s'.",
        "transformers_utils/config.py:912",
        re.compile(
            r"Invalid repository ID or local directory specified|"
            r"Repository Not Found|GatedRepoError"
        ),
        "check --model: a Hugging Face repo id or a local folder with config.json; a gated "
        "or private repo needs HF_TOKEN in the backend's env:",
    ),
    Failure(
        "unsupported_architecture",
        "Model architectures %s are not supported for now.",
        "model_executor/models/registry.py:1250",
        re.compile(
            r"Model architectures? .* (?:are not supported for now|"
            r"is not supported anymore|is not supported in-tree)"
        ),
        "this vLLM cannot run the model's architecture: upgrade vLLM (or install the "
        "plugin it names), try --model-impl transformers, or choose another --model",
    ),
    Failure(
        "port_in_use",
        "[Errno 98] Address already in use (socket.bind)",
        "entrypoints/launchers/launcher.py:353",
        re.compile(r"[Aa]ddress already in use"),
        "another server holds the port: free it, or give vLLM --port matching the backend's "
        "url: with a free port",
    ),
)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    key: str
    line: str  # the decisive line's message, at most MAX_QUOTE characters
    hint: str


def _quote(text: str) -> str:
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def diagnose(lines: Iterable[str]) -> list[Diagnosis]:
    """The decisive lines among a failed start's last lines: for each recognised failure
    (the first entry of `FAILURES` a line matches), its last line; in the table's order
    (the most specific first), at most `MAX_DIAGNOSES`."""
    found: dict[str, str] = {}
    for line in lines:
        said = message(line)
        for failure in FAILURES:
            if failure.pattern.search(said):
                found[failure.key] = said
                break
    return [Diagnosis(f.key, _quote(found[f.key]), f.hint) for f in FAILURES if f.key in found][
        :MAX_DIAGNOSES
    ]


def explain(lines: Iterable[str]) -> str:
    """`; it said: "..." (hint: ...)` for each decisive line, or "" when none is
    recognised: appended to a start failure's reason."""
    return "".join(f'; it said: "{d.line}" (hint: {d.hint})' for d in diagnose(lines))

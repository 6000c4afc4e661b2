"""Several vLLM instances on one GPU: which ``--gpu-memory-utilization`` each one needs.

Pure functions; no I/O. A later caller (e.g. a ``plan profile`` command reading the gateway's
config) builds a :class:`ShareRequest` of :class:`InstanceSpec` in start order and calls
:func:`plan_share`.

Memory model (vLLM 0.33's V1 worker, ``vllm/v1/worker/gpu_worker.py``; per-instance accounting
since vLLM PR #18974). ``T`` is the GPU's total memory; for each instance, in start order:

``F``
    memory free on the GPU when it starts: ``T`` minus whatever other processes hold
    (``baseline_used_bytes``: desktop, embeddings, ...) minus the instances started before it.
    Instances must start one at a time (vLLM #55827: instances that profile concurrently
    charge each other's loading to their own budget).
``C`` (``cuda_context_bytes``)
    CUDA context (+ NCCL buffers, cuBLAS handles) the instance creates *before* vLLM takes its
    start-up memory snapshot (``Worker.init_device``). It is neither checked nor budgeted, but
    it occupies memory.
``W``, ``O``, ``G``, ``K``
    weights; runtime overhead (activation peak of the profiling run + non-torch allocations,
    which the profile charges to the instance); CUDA-graph memory (0 with ``--enforce-eager``,
    where vLLM's ``cudagraph_mode`` is ``NONE``); the KV-cache budget the instance should get.

Start-up check (always, whatever the other flags)
    ``F - C >= U x T``: vLLM refuses to start when the free memory at its snapshot is below the
    requested fraction of *total* memory ("Free memory on device ... on startup is less than
    desired GPU memory utilization", ``vllm/v1/worker/utils.py`` ``request_memory``, with
    ``requested = ceil(T x U)``). So ``U`` is a budget for the whole instance, not a share of
    what is free, and a later instance must ask for no more than what is left.

``--gpu-memory-utilization U`` alone (KV from the budget)
    KV = ``U x T - W - O - G`` (``Worker.determine_available_memory`` in
    ``vllm/v1/worker/gpu_worker.py``: ``requested_memory - non_kv_cache_memory -
    cudagraph_memory_estimate_applied``). Since vLLM 0.21 the CUDA graphs are profiled before
    the KV cache is sized and their estimate is taken from the budget
    (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to ``1``, ``vllm/envs.py``), so they
    sit *inside* ``U x T`` and the instance holds ``C + U x T``. vLLM logs "CUDA graph memory
    profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=U is
    equivalent to --gpu-memory-utilization=U' without CUDA graph memory profiling. ..."
    (``gpu_worker.py``, ``determine_available_memory``).
    With ``graphs_in_budget=False`` on an instance (vLLM < 0.21, or
    ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``; ``plan share --graphs-outside-budget``,
    ``model_info.graphs_outside_budget``) KV = ``U x T - W - O`` and the graphs, captured after
    the KV cache is allocated, come on top: the instance holds ``C + U x T + G``.
    KV must be > 0 (else "No available memory for the cache blocks",
    ``vllm/v1/core/kv_cache_planning.py`` ``_check_enough_kv_cache_memory``) and should be
    >= ``K``. The planner picks the smallest ``U`` on a ``utilization_step`` grid with
    ``U x T >= W + O + K (+ G when in the budget)``.

``--kv-cache-memory-bytes K`` (+ a ``U`` that only has to pass the start-up check)
    vLLM skips the budget (and the graph estimate: ``determine_available_memory`` returns ``K``
    before profiling the graphs, ``vllm/config/cache.py``) and allocates exactly ``K``; the
    instance holds ``C + W + O + G + K`` whatever ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
    says. ``U`` is set to that footprint (without ``C``) rounded *down* to the grid, so the
    start-up check asks for no more than the instance will really take and still fails early if
    the memory is not there.

Either way the instance must physically fit: its footprint must be <= ``F``, or it runs out of
memory while loading, allocating the KV cache, or capturing CUDA graphs.

When to use ``--kv-cache-memory-bytes``: the planner prefers plain ``U`` and switches to
``--kv-cache-memory-bytes`` when no grid value of ``U`` passes both checks while the instance
would physically fit: when rounding ``U`` up to the grid overshoots what is free (tight fits),
or under ``legacy_accounting``. The latter models vLLM before PR #18974, whose profile charged
*every* byte in use on the GPU (other processes and its own CUDA context included) to the
starting instance: KV = ``U x T - W - O - (T - F)``. Together with the start-up check that gives
``T - F + W + O + K <= U x T <= F - C``, impossible while others hold much memory: this is the
"no valid value" of the two-instances article. ``--kv-cache-memory-bytes`` is also the robust
choice when ``O`` is uncertain (it fixes the KV size; ``U`` fixes the footprint instead).

What the model does not cover: memory other processes allocate *after* an instance started,
fragmentation, vLLM's optional 150 MiB safety margin, and LoRA / speculative-decoding buffers
(add them to ``O``). For accurate plans read the parts from vLLM 0.33's start-up log
(``gpu_worker.py``, ``compile_or_warm_up_model``): "Free memory on device (F/T GiB) on
startup. Desired GPU memory utilization is (U, R GiB). Actual usage is X GiB for consumed
memory (weights + non-torch), Y GiB for peak activation, and G GiB for CUDAGraph memory. ..."
``W + O`` is ``X`` plus ``Y`` minus the graph estimate that ``Y`` includes while graph
profiling is on (``peak_activation_memory`` adds ``cudagraph_memory_estimate_applied``); the
estimate itself is in "CUDA graph pool memory: G GiB (actual), E GiB (estimated), ...", and the
KV cache vLLM got in "Available KV cache memory: KV GiB".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from app.planner.kv import VLLM_BLOCK_SIZE, max_concurrency, one_request_kv_bytes
from app.planner.units import (
    GIB,
    bytes_to_gib,
    require_non_negative,
    require_positive,
    require_positive_int,
)
from app.planner.utilization_grid import ceil_to_grid, decimals, decimals_of, floor_to_grid

KvMode = Literal["auto", "utilization", "kv-bytes"]
KV_MODES: tuple[KvMode, ...] = ("auto", "utilization", "kv-bytes")

#: Activation peak + non-torch memory of a small instance when nothing better is known.
DEFAULT_INSTANCE_OVERHEAD_BYTES = 1 * GIB
#: CUDA context (+ NCCL) created before vLLM's start-up snapshot; KAITO #2139 measured ~0.6 GiB
#: with NCCL, a single-GPU context is usually 0.3-0.5 GiB.
DEFAULT_CUDA_CONTEXT_BYTES = GIB // 2
DEFAULT_UTILIZATION_STEP = 0.01


def _gib(n_bytes: float) -> str:
    return f"{bytes_to_gib(n_bytes):.2f} GiB"


@dataclass(frozen=True)
class InstanceSpec:
    """One vLLM instance, as it will be started. All sizes in bytes.

    ``gpu_memory_utilization`` pins a value to check instead of letting the planner choose;
    ``kv_mode`` forces (``"utilization"`` / ``"kv-bytes"``) or leaves to the planner
    (``"auto"``) whether ``--kv-cache-memory-bytes`` is used. ``graphs_in_budget``: vLLM takes
    the CUDA graphs' estimate from the ``--gpu-memory-utilization`` budget (vLLM >= 0.21, where
    ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` is the default: ``vllm/envs.py``,
    ``Worker.determine_available_memory`` in ``vllm/v1/worker/gpu_worker.py``); False for
    vLLM < 0.21 or a server started with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``, whose
    graphs come on top of the budget.

    ``max_model_len`` and ``kv_bytes_per_token`` (one GPU's share), when known, add vLLM's own
    KV check: it refuses to start when its KV cache cannot hold one request of
    ``max_model_len`` tokens (``min_kv_bytes``), and the plan reports how many such requests
    the cache holds (``InstancePlan.max_concurrency``).
    """

    name: str
    weight_bytes: int
    kv_bytes: int
    graph_bytes: int = 0
    overhead_bytes: int = DEFAULT_INSTANCE_OVERHEAD_BYTES
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    enforce_eager: bool = False
    gpu_memory_utilization: float | None = None
    kv_mode: KvMode = "auto"
    graphs_in_budget: bool = True
    max_model_len: int | None = None
    kv_bytes_per_token: float | None = None

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("instance name must not be empty")
        require_positive(self.weight_bytes, f"{self.name}: weights")
        require_positive(self.kv_bytes, f"{self.name}: KV budget")
        require_non_negative(self.graph_bytes, f"{self.name}: CUDA-graph memory")
        require_non_negative(self.overhead_bytes, f"{self.name}: overhead")
        require_non_negative(self.cuda_context_bytes, f"{self.name}: CUDA context")
        if self.gpu_memory_utilization is not None:
            require_positive(self.gpu_memory_utilization, f"{self.name}: gpu_memory_utilization")
            if self.gpu_memory_utilization > 1:
                raise ValueError(
                    f"{self.name}: gpu_memory_utilization must be <= 1, "
                    f"got {self.gpu_memory_utilization!r}"
                )
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"{self.name}: kv_mode must be one of {', '.join(KV_MODES)}")
        if (self.max_model_len is None) != (self.kv_bytes_per_token is None):
            raise ValueError(f"{self.name}: give max_model_len and kv_bytes_per_token together")
        if self.max_model_len is not None:
            require_positive_int(self.max_model_len, f"{self.name}: max_model_len")
        if self.kv_bytes_per_token is not None:
            require_positive(self.kv_bytes_per_token, f"{self.name}: KV bytes per token")

    @property
    def min_kv_bytes(self) -> int | None:
        """vLLM's least KV cache: one request of ``max_model_len`` tokens (None: unknown)."""
        if self.max_model_len is None or self.kv_bytes_per_token is None:
            return None
        return one_request_kv_bytes(self.kv_bytes_per_token, self.max_model_len)

    def concurrency(self, kv_bytes: float) -> float | None:
        """Requests of ``max_model_len`` tokens ``kv_bytes`` of KV cache hold (vLLM's figure)."""
        if self.max_model_len is None or self.kv_bytes_per_token is None:
            return None
        return max_concurrency(kv_bytes, self.kv_bytes_per_token, self.max_model_len)

    @property
    def graphs(self) -> int:
        """CUDA-graph memory actually captured (0 with ``--enforce-eager``)."""
        return 0 if self.enforce_eager else self.graph_bytes

    @property
    def graphs_charged(self) -> int:
        """CUDA-graph memory vLLM takes from the ``--gpu-memory-utilization`` budget."""
        return self.graphs if self.graphs_in_budget else 0

    @property
    def footprint_bytes(self) -> int:
        """Memory the instance holds with exactly its KV budget, CUDA context included."""
        return (
            self.cuda_context_bytes
            + self.weight_bytes
            + self.overhead_bytes
            + self.graphs
            + self.kv_bytes
        )


@dataclass(frozen=True)
class ShareRequest:
    """A GPU and the instances to start on it, in start order."""

    total_bytes: int
    instances: tuple[InstanceSpec, ...]
    baseline_used_bytes: int = 0
    reserve_bytes: int = 0
    legacy_accounting: bool = False
    utilization_step: float = DEFAULT_UTILIZATION_STEP

    def __post_init__(self) -> None:
        require_positive(self.total_bytes, "GPU memory")
        if not self.instances:
            raise ValueError("give at least one instance")
        names = [spec.name for spec in self.instances]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique, got {', '.join(names)}")
        require_non_negative(self.baseline_used_bytes, "memory already in use")
        if self.baseline_used_bytes >= self.total_bytes:
            raise ValueError("memory already in use must be less than the GPU's total memory")
        require_non_negative(self.reserve_bytes, "reserve")
        require_positive(self.utilization_step, "utilization step")
        if self.utilization_step > 1:
            raise ValueError("utilization step must be <= 1")


@dataclass(frozen=True)
class InstancePlan:
    """What one instance should be started with and what it will hold (bytes)."""

    name: str
    ok: bool
    runs: bool
    mode: Literal["utilization", "kv-bytes"]
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    flags: tuple[str, ...]
    free_at_start_bytes: float
    requested_bytes: float
    kv_bytes: float
    expected_used_bytes: float
    free_after_bytes: float
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    advice: tuple[str, ...]
    #: vLLM's "Maximum concurrency for N tokens per request"; None without max_model_len.
    max_concurrency: float | None = None


@dataclass(frozen=True)
class SharePlan:
    """The whole GPU: every instance's plan and the memory left at the end."""

    total_bytes: int
    baseline_used_bytes: int
    instances: tuple[InstancePlan, ...]
    free_bytes: float
    fits: bool
    problems: tuple[str, ...]


@dataclass(frozen=True)
class _Outcome:
    mode: Literal["utilization", "kv-bytes"]
    utilization: float
    requested: float
    kv: float
    used: float
    runs: bool
    ok: bool
    problems: tuple[str, ...]


def _evaluate(
    spec: InstanceSpec,
    req: ShareRequest,
    free: float,
    mode: Literal["utilization", "kv-bytes"],
    utilization: float,
) -> _Outcome:
    total = req.total_bytes
    ctx = spec.cuda_context_bytes
    # --kv-cache-memory-bytes returns before the graphs are profiled: on top either way.
    graphs_in = spec.graphs_charged if mode == "utilization" else 0
    requested = utilization * total
    snapshot_free = free - ctx
    minimum = spec.min_kv_bytes
    problems: list[str] = []
    startup_ok = snapshot_free >= requested
    if not startup_ok:
        problems.append(
            f"start-up check fails: {_gib(snapshot_free)} free after its CUDA context < "
            f"{utilization:g} x {_gib(total)} = {_gib(requested)}"
        )
    if mode == "utilization":
        charged = spec.weight_bytes + spec.overhead_bytes + graphs_in
        others = (total - free) + ctx if req.legacy_accounting else 0.0
        kv = requested - charged - others
        terms = f"weights {_gib(spec.weight_bytes)} - overhead {_gib(spec.overhead_bytes)}"
        if graphs_in:
            terms += f" - CUDA graphs {_gib(graphs_in)}"
        if others:
            terms += f" - memory already in use on the GPU {_gib(others)} (legacy accounting)"
        if kv <= 0:
            problems.append(
                f"KV check fails: {_gib(requested)} budget - {terms} = {_gib(kv)} "
                "for the KV cache (vLLM: 'No available memory for the cache blocks')"
            )
        elif minimum is not None and kv < minimum:
            problems.append(
                f"KV check fails: {_gib(requested)} budget - {terms} = {_gib(kv)} for the KV "
                f"cache, less than the {_gib(minimum)} one request of max_model_len "
                f"{spec.max_model_len} tokens needs (vLLM refuses to start: 'To serve at least "
                "one request with the model's max seq len ...')"
            )
        elif kv < spec.kv_bytes:
            problems.append(
                f"KV cache gets only {_gib(kv)} ({_gib(requested)} budget - {terms}), "
                f"less than its {_gib(spec.kv_bytes)} budget"
            )
    else:
        kv = float(spec.kv_bytes)
    used = ctx + spec.weight_bytes + spec.overhead_bytes + spec.graphs + max(kv, 0.0)
    fits = used <= free
    kv_ok = kv > 0 and (minimum is None or kv >= minimum)
    if startup_ok and kv_ok and not fits:
        detail = ""
        if spec.graphs and not graphs_in and used - spec.graphs <= free:
            detail = (
                f"; its CUDA graphs ({_gib(spec.graphs)}) are captured last, outside "
                "--gpu-memory-utilization, and do not fit"
            )
        problems.append(
            f"out of memory: it needs {_gib(used)} but only {_gib(free)} is free when it "
            f"starts{detail}"
        )
    runs = startup_ok and kv_ok and fits
    ok = runs and kv >= spec.kv_bytes
    return _Outcome(mode, utilization, requested, kv, used, runs, ok, tuple(problems))


def _utilization_outcome(spec: InstanceSpec, req: ShareRequest, free: float) -> _Outcome | str:
    total = req.total_bytes
    needed: float = spec.weight_bytes + spec.overhead_bytes + spec.kv_bytes + spec.graphs_charged
    if req.legacy_accounting:
        needed += (total - free) + spec.cuda_context_bytes
    utilization = ceil_to_grid(needed, total, req.utilization_step)
    if utilization is None:
        return (
            f"no --gpu-memory-utilization <= 1 leaves its KV budget: it would need "
            f"{needed / total:.3f} x {_gib(total)}"
        )
    return _evaluate(spec, req, free, "utilization", utilization)


def _kv_bytes_outcome(spec: InstanceSpec, req: ShareRequest, free: float) -> _Outcome:
    after_snapshot = spec.footprint_bytes - spec.cuda_context_bytes
    limit = min(after_snapshot, free - spec.cuda_context_bytes)
    utilization = floor_to_grid(max(limit, 0.0), req.total_bytes, req.utilization_step)
    return _evaluate(spec, req, free, "kv-bytes", utilization)


def _choose(spec: InstanceSpec, req: ShareRequest, free: float) -> tuple[_Outcome, list[str]]:
    """The outcome to report for ``spec`` and notes explaining the choice."""
    notes: list[str] = []
    if spec.gpu_memory_utilization is not None:
        mode: Literal["utilization", "kv-bytes"] = (
            "kv-bytes" if spec.kv_mode == "kv-bytes" else "utilization"
        )
        return _evaluate(spec, req, free, mode, spec.gpu_memory_utilization), notes
    if spec.kv_mode == "kv-bytes":
        return _kv_bytes_outcome(spec, req, free), notes
    util = _utilization_outcome(spec, req, free)
    if spec.kv_mode == "utilization":
        if isinstance(util, str):
            fallback = _evaluate(spec, req, free, "utilization", 1.0)
            return _with_problem(fallback, util), notes
        return util, notes
    if isinstance(util, _Outcome) and util.ok:
        return util, notes
    kv_bytes = _kv_bytes_outcome(spec, req, free)
    why = _why_no_utilization(spec, req, free)
    if kv_bytes.ok:
        notes.append(
            "no --gpu-memory-utilization passes both vLLM checks "
            f"({why}); --kv-cache-memory-bytes fixes the KV cache size and the utilization "
            "only has to pass the start-up check"
        )
    return kv_bytes, notes


def _why_no_utilization(spec: InstanceSpec, req: ShareRequest, free: float) -> str:
    """Explain why no ``--gpu-memory-utilization`` on the grid passes both checks."""
    total = req.total_bytes
    terms = ["weights", "overhead", "KV budget"]
    needed: float = spec.weight_bytes + spec.overhead_bytes + spec.kv_bytes
    graphs_out = spec.graphs
    if spec.graphs_in_budget and spec.graphs:
        needed += spec.graphs
        graphs_out = 0
        terms.append("CUDA graphs")
    if req.legacy_accounting:
        needed += (total - free) + spec.cuda_context_bytes
        terms.append("memory already in use on the GPU (legacy accounting)")
    start_up = free - spec.cuda_context_bytes
    physical = start_up - graphs_out
    upper, limit = (
        (start_up, "the start-up check allows")
        if start_up <= physical
        else (physical, "with its CUDA graphs on top, memory allows")
    )
    if needed > upper:
        return (
            f"the KV check needs U x {_gib(total)} >= {_gib(needed)} ({' + '.join(terms)}) but "
            f"{limit} at most {_gib(upper)}"
        )
    return (
        f"no {req.utilization_step:g} step of U lies between {needed / total:.4f} "
        f"(KV check) and {upper / total:.4f} (free memory)"
    )


def _with_problem(outcome: _Outcome, problem: str) -> _Outcome:
    return _Outcome(
        outcome.mode,
        outcome.utilization,
        outcome.requested,
        outcome.kv,
        outcome.used,
        outcome.runs,
        False,
        (problem, *outcome.problems),
    )


def _advice(
    spec: InstanceSpec,
    req: ShareRequest,
    free: float,
    earlier_graphs: list[tuple[str, int]],
) -> list[str]:
    advice: list[str] = []
    shortfall = spec.footprint_bytes - free
    if shortfall <= 0:
        auto = _choose(_unpinned(spec), req, free)[0]
        if auto.ok:
            flags = " ".join(_flags(spec, auto, req.utilization_step))
            advice.append(f"start it with {flags} instead")
        return advice
    advice.append(
        f"it needs {_gib(spec.footprint_bytes)} (CUDA context {_gib(spec.cuda_context_bytes)}"
        f" + weights {_gib(spec.weight_bytes)} + overhead {_gib(spec.overhead_bytes)}"
        f" + CUDA graphs {_gib(spec.graphs)} + KV {_gib(spec.kv_bytes)}) but only "
        f"{_gib(free)} is free when it starts: {_gib(shortfall)} short"
    )
    if spec.graphs:
        if spec.graphs >= shortfall:
            advice.append(
                f"its CUDA graphs do not fit: use --enforce-eager (frees {_gib(spec.graphs)}) or "
                "capture fewer batch sizes (lower --max-num-seqs or the compilation config's "
                f"max_cudagraph_capture_size) so they take at most "
                f"{_gib(spec.graphs - shortfall)}"
            )
        else:
            advice.append(
                f"even --enforce-eager (frees {_gib(spec.graphs)}) leaves it "
                f"{_gib(shortfall - spec.graphs)} short"
            )
    held = sum(graphs for _, graphs in earlier_graphs)
    if held:
        listing = ", ".join(f"{name}: {_gib(graphs)}" for name, graphs in earlier_graphs)
        enough = " - enough" if held + spec.graphs >= shortfall else " - not enough on its own"
        advice.append(
            f"instances started before it hold {_gib(held)} of CUDA graphs ({listing}); "
            f"--enforce-eager or fewer captured batch sizes there frees up to {_gib(held)}"
            f"{enough}"
        )
    minimum = spec.min_kv_bytes
    if spec.kv_bytes > shortfall and minimum is not None and spec.kv_bytes <= minimum:
        tokens = _longest_context(spec, spec.kv_bytes - shortfall)
        if tokens > 0:
            advice.append(
                f"or a shorter --max-model-len: one request of at most {tokens} tokens fits in "
                f"{_gib(spec.kv_bytes - shortfall)} of KV cache"
            )
    elif spec.kv_bytes > shortfall:
        advice.append(f"or lower its KV budget to at most {_gib(spec.kv_bytes - shortfall)}")
    fixed = spec.cuda_context_bytes + spec.weight_bytes + spec.overhead_bytes
    if fixed > free:
        advice.append(
            f"its CUDA context, weights and overhead alone ({_gib(fixed)}) exceed the free "
            "memory: use a smaller or more quantised model, or start it before the others"
        )
    return advice


def _longest_context(spec: InstanceSpec, kv_bytes: float) -> int:
    """Most tokens one request may have for vLLM to start with ``kv_bytes`` of KV cache."""
    assert spec.kv_bytes_per_token is not None
    blocks = math.floor(kv_bytes / (VLLM_BLOCK_SIZE * spec.kv_bytes_per_token)) - 1  # null block
    return max(blocks, 0) * VLLM_BLOCK_SIZE


def _unpinned(spec: InstanceSpec) -> InstanceSpec:
    return replace(spec, gpu_memory_utilization=None, kv_mode="auto")


def _flags(spec: InstanceSpec, outcome: _Outcome, step: float) -> tuple[str, ...]:
    flags = ["--gpu-memory-utilization", f"{outcome.utilization:.{decimals(step)}f}"]
    if outcome.mode == "kv-bytes":
        flags += ["--kv-cache-memory-bytes", str(spec.kv_bytes)]
    if spec.enforce_eager:
        flags.append("--enforce-eager")
    return tuple(flags)


def plan_share(req: ShareRequest) -> SharePlan:
    """Plan every instance in start order (see the module docstring for the model)."""
    free = float(req.total_bytes - req.baseline_used_bytes)
    plans: list[InstancePlan] = []
    earlier_graphs: list[tuple[str, int]] = []
    for spec in req.instances:
        outcome, notes = _choose(spec, req, free)
        if spec.graphs and not spec.graphs_in_budget and outcome.mode == "utilization":
            notes.append(
                f"its CUDA graphs ({_gib(spec.graphs)}) are planned on top of "
                "--gpu-memory-utilization: true for vLLM < 0.21; a newer vLLM needs "
                "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 in its environment"
            )
        step = req.utilization_step
        if spec.gpu_memory_utilization is not None:
            step = min(step, 10.0 ** -decimals_of(spec.gpu_memory_utilization))
        used = outcome.used if outcome.runs else 0.0
        advice = [] if outcome.ok else _advice(spec, req, free, earlier_graphs)
        problems = list(outcome.problems)
        if not outcome.runs:
            problems.append("it would not come up, so later instances are planned without it")
        plans.append(
            InstancePlan(
                name=spec.name,
                ok=outcome.ok,
                runs=outcome.runs,
                mode=outcome.mode,
                gpu_memory_utilization=outcome.utilization,
                kv_cache_memory_bytes=spec.kv_bytes if outcome.mode == "kv-bytes" else None,
                flags=_flags(spec, outcome, step),
                free_at_start_bytes=free,
                requested_bytes=outcome.requested,
                kv_bytes=outcome.kv,
                expected_used_bytes=used,
                free_after_bytes=free - used,
                problems=tuple(problems),
                notes=tuple(notes),
                advice=tuple(advice),
                max_concurrency=spec.concurrency(outcome.kv),
            )
        )
        free -= used
        if outcome.runs and spec.graphs:
            earlier_graphs.append((spec.name, spec.graphs))
    plan_problems: list[str] = []
    if free < req.reserve_bytes:
        plan_problems.append(
            f"only {_gib(free)} stays free, less than the {_gib(req.reserve_bytes)} reserve"
        )
    fits = all(plan.ok for plan in plans) and not plan_problems
    return SharePlan(
        total_bytes=req.total_bytes,
        baseline_used_bytes=req.baseline_used_bytes,
        instances=tuple(plans),
        free_bytes=free,
        fits=fits,
        problems=tuple(plan_problems),
    )

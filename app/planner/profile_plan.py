"""A GPU profile against the GPU: do its enabled instances fit, and how to start each one.

Pure (no I/O): takes loaded `Settings` and a profile name; `microscheduler plan profile`
prints the result.

- The instances are the backends the profile enables, in the order they start: pinned ones
  first, then lazy ones (as if every lazy backend were running at once), each in
  `models.yaml` order. A backend on several GPUs is planned on each (tensor parallel).
- A described backend (`model_info:` / `hf_config:`) becomes a `plan_share` instance
  (`app/planner/share.py`): the profile's `vram_pct / 100` pins its `--gpu-memory-utilization`
  (else its `model_info.gpu_memory_utilization`, else the planner chooses), `cuda_graphs`
  and `sleep_mode` override the backend's.
- CUDA graphs count inside the `--gpu-memory-utilization` budget, as vLLM >= 0.21 does; a
  backend with `model_info.graphs_outside_budget` is planned with them on top, and its
  command's environment gets `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0` so that a current
  vLLM behaves as planned (`vllm/envs.py`, `Worker.determine_available_memory` in
  `vllm/v1/worker/gpu_worker.py`; an older vLLM ignores the variable or has it off).
- A backend without a description is not planned; when its memory is known (`vram_mib`, or
  the profile's `vram_pct`) that much is counted as in use before the first instance starts
  (the cautious side for the start-up checks); otherwise it is listed as not counted.
- The plan fits when every instance passes vLLM's checks with its KV budget, and what they
  use together stays within the profile's `target_utilization_pct` of the GPU.
- Without `gpu_profiles.yaml`, `plan_all_backends` plans every backend of `models.yaml` as
  one implicit profile (`ImplicitProfile`: no shares, no target below the whole GPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from app.planner.description import PlannedModel, resolve
from app.planner.footprint import Footprint, instance_spec, planned_footprint_mib
from app.planner.inputs import PlannedBackend, PlannedSettings, Profile, ProfileModel
from app.planner.share import InstancePlan, InstanceSpec, SharePlan, ShareRequest, plan_share
from app.planner.units import MIB, bytes_to_gib

SLEEP_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
#: vLLM >= 0.21 without its CUDA-graph estimate: graphs on top of the budget (`vllm/envs.py`).
GRAPHS_OUTSIDE_BUDGET_ENV = {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}


@dataclass(frozen=True)
class PlannedInstance:
    """One described backend on one GPU: its plan and the command that starts it."""

    backend: str
    gpu: int
    config: PlannedBackend
    planned: PlannedModel
    spec: InstanceSpec
    plan: InstancePlan
    vram_pct: float | None
    sleep_mode: bool
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class Unplanned:
    """An enabled backend without a model description."""

    backend: str
    gpus: tuple[int, ...]
    footprint: Footprint | None  # counted as in use; None: its memory is not counted

    @property
    def missing(self) -> str:
        return (
            f"no model description: add model_info: or hf_config: to backends.{self.backend} "
            "in models.yaml"
        )


@dataclass(frozen=True)
class GpuPlan:
    gpu: int
    held_bytes: int  # backends without a description, counted before the first instance
    share: SharePlan | None  # None when no described instance runs on this GPU
    used_bytes: float
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems and (self.share is None or self.share.fits)


@dataclass(frozen=True)
class ProfilePlan:
    name: str
    active: bool
    profile: Profile
    total_bytes: int
    instances: tuple[PlannedInstance, ...]  # by GPU, in start order
    unplanned: tuple[Unplanned, ...]
    disabled: tuple[str, ...]
    gpus: tuple[GpuPlan, ...]
    implicit: bool = False  # no gpu_profiles.yaml: every backend, `plan_all_backends`

    @property
    def fits(self) -> bool:
        return all(gpu.fits for gpu in self.gpus)

    @property
    def complete(self) -> bool:
        """Every enabled backend's memory is known (planned or counted)."""
        return all(item.footprint is not None for item in self.unplanned)

    @property
    def problems(self) -> tuple[str, ...]:
        """Why it does not fit, one sentence per cause."""
        many = len(self.gpus) > 1
        found: list[str] = []
        for gpu in self.gpus:
            where = f"GPU {gpu.gpu}: " if many else ""
            found.extend(
                f"{where}{item.backend}: {_why(item)}"
                for item in self.instances
                if item.gpu == gpu.gpu and not item.plan.ok
            )
            found.extend(f"{where}{text}" for text in gpu.problems)
            if gpu.share is not None:
                found.extend(f"{where}{text}" for text in gpu.share.problems)
        return tuple(found)


def _why(item: PlannedInstance) -> str:
    need, free = item.spec.footprint_bytes, item.plan.free_at_start_bytes
    if need > free:
        return (
            f"it needs {bytes_to_gib(need):.2f} GiB but only {bytes_to_gib(free):.2f} GiB is "
            f"free when it starts ({bytes_to_gib(need - free):.2f} GiB short)"
        )
    return item.plan.problems[0] if item.plan.problems else "does not fit"


def start_order(settings: PlannedSettings, profile: Profile) -> list[str]:
    """The backends `profile` enables, pinned first, each group in `models.yaml` order."""
    enabled = [name for name in settings.backends if profile.enabled(name)]
    return sorted(enabled, key=lambda name: settings.backends[name].lifecycle != "pinned")


def vllm_command(
    config: PlannedBackend,
    planned: PlannedModel,
    plan: InstancePlan,
    *,
    sleep_mode: bool,
    graphs_outside_budget: bool = False,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """`vllm serve ...` for one instance (argv) and the environment it needs."""
    model = planned.repo or config.served_model
    argv = ["vllm", "serve", model]
    if model != config.served_model:
        argv += ["--served-model-name", config.served_model]
    port = urlsplit(config.url).port
    if port is not None:
        argv += ["--port", str(port)]
    if config.gpu_count > 1:
        argv += ["--tensor-parallel-size", str(config.gpu_count)]
    argv += plan.flags
    if planned.kv_dtype_flag is not None:
        argv += ["--kv-cache-dtype", planned.kv_dtype_flag]
    argv += ["--max-model-len", str(planned.max_model_len)]
    if planned.max_num_seqs is not None:  # only when configured; else vLLM's default
        argv += ["--max-num-seqs", str(planned.max_num_seqs)]
    env: dict[str, str] = {}
    if graphs_outside_budget:
        env.update(GRAPHS_OUTSIDE_BUDGET_ENV)
    if sleep_mode:
        argv.append("--enable-sleep-mode")
        env.update(SLEEP_MODE_ENV)
    return tuple(argv), env


@dataclass(frozen=True)
class ImplicitProfile:
    """Every backend of `models.yaml` as configured: the profile `plan profile` plans when
    there is no `gpu_profiles.yaml`. No shares (`vram_pct`), and no target below the GPU."""

    models: Mapping[str, ProfileModel] = field(default_factory=dict)
    target_utilization_pct: float = 100.0
    gpu_total_gb: float | None = None

    def enabled(self, backend: str) -> bool:
        return True


def plan_profile(settings: PlannedSettings, name: str, *, total_bytes: int) -> ProfilePlan:
    """Plan profile `name` of `settings.gpu_profiles` on GPUs of `total_bytes` each."""
    if settings.gpu_profiles is None:
        raise ValueError("there are no GPU profiles (gpu_profiles.yaml)")
    profiles = settings.gpu_profiles
    profile = profiles.profiles.get(name)
    if profile is None:
        raise ValueError(f"unknown profile {name!r} (profiles: {', '.join(profiles.profiles)})")
    return _plan(settings, profile, name, total_bytes, active=name == profiles.default)


def plan_all_backends(settings: PlannedSettings, *, total_bytes: int) -> ProfilePlan:
    """Plan every backend of `settings` as one profile (pinned first) on GPUs of `total_bytes`
    each: what runs without `gpu_profiles.yaml` (`ImplicitProfile`, `ProfilePlan.implicit`)."""
    plan = _plan(settings, ImplicitProfile(), "", total_bytes, active=True)
    return replace(plan, implicit=True)


def _plan(
    settings: PlannedSettings, profile: Profile, name: str, total_bytes: int, *, active: bool
) -> ProfilePlan:
    total_mib = total_bytes // MIB
    order = start_order(settings, profile)
    described: list[tuple[str, PlannedModel]] = []
    unplanned: list[Unplanned] = []
    for backend in order:
        config = settings.backends[backend]
        planned = resolve(config.model_info, config.hf_config)
        if planned is not None:
            described.append((backend, planned))
            continue
        chosen = profile.models.get(backend)
        share = None
        if chosen is not None and chosen.vram_pct is not None:
            share = int(total_mib * chosen.vram_pct / 100)
        footprint = planned_footprint_mib(
            config, gpu_total_mib=total_mib, profile_planned_mib=share
        )
        unplanned.append(Unplanned(backend, tuple(config.first_gpus), footprint))

    instances: list[PlannedInstance] = []
    gpu_plans: list[GpuPlan] = []
    used_gpus = sorted({gpu for backend in order for gpu in settings.backends[backend].first_gpus})
    for gpu in used_gpus:
        held = sum(
            item.footprint.mib * MIB
            for item in unplanned
            if item.footprint is not None and gpu in item.gpus
        )
        here = [(b, p) for b, p in described if gpu in settings.backends[b].first_gpus]
        gpu_plan, planned_here = _plan_gpu(settings, profile, gpu, here, held, total_bytes)
        gpu_plans.append(gpu_plan)
        instances.extend(planned_here)
    return ProfilePlan(
        name=name,
        active=active,
        profile=profile,
        total_bytes=total_bytes,
        instances=tuple(instances),
        unplanned=tuple(unplanned),
        disabled=tuple(b for b in settings.backends if not profile.enabled(b)),
        gpus=tuple(gpu_plans),
    )


def _plan_gpu(
    settings: PlannedSettings,
    profile: Profile,
    gpu: int,
    described: list[tuple[str, PlannedModel]],
    held: int,
    total_bytes: int,
) -> tuple[GpuPlan, list[PlannedInstance]]:
    if held >= total_bytes:
        problem = (
            f"backends without a model description hold {bytes_to_gib(held):.2f} GiB, "
            f"the whole {bytes_to_gib(total_bytes):.2f} GiB GPU"
        )
        return GpuPlan(gpu, held, None, float(held), (problem,)), []
    specs = [_spec(settings, profile, backend, planned) for backend, planned in described]
    share: SharePlan | None = None
    used = float(held)
    if specs:
        share = plan_share(
            ShareRequest(total_bytes=total_bytes, instances=tuple(specs), baseline_used_bytes=held)
        )
        used = total_bytes - share.free_bytes
    instances = [
        _instance(settings, profile, gpu, backend, planned, spec, plan)
        for (backend, planned), spec, plan in zip(
            described, specs, share.instances if share else (), strict=True
        )
    ]
    problems: list[str] = []
    target = profile.target_utilization_pct
    if used > total_bytes * target / 100:
        problems.append(
            f"together they use {bytes_to_gib(used):.2f} GiB, {100 * used / total_bytes:.1f}% "
            f"of the {bytes_to_gib(total_bytes):.2f} GiB GPU, more than the profile's "
            f"target_utilization_pct {target:g}%: "
            + over_target(instances, held=held, used=used, total=total_bytes, target_pct=target)
        )
    return GpuPlan(gpu, held, share, used, tuple(problems)), instances


def over_target(
    instances: list[PlannedInstance], *, held: int, used: float, total: int, target_pct: float
) -> str:
    """Why the instances use more than `target_pct` of the GPU, and what would fit.

    vLLM's `--gpu-memory-utilization` share does not include the CUDA context: the worker
    creates it (with NCCL and cuBLAS handles) before the start-up memory snapshot, and the
    share is `U x total` checked against what that snapshot finds free
    (`Worker.init_device`, vllm/v1/worker/gpu_worker.py:500-543; `request_memory`,
    vllm/v1/worker/utils.py:716-726). So an instance holds its context on top of its
    `vram_pct`, and `vram_pct` equal to `target_utilization_pct` cannot stay within it.
    """
    running = [item for item in instances if item.plan.runs]
    shares = sum(item.plan.requested_bytes for item in running)
    contexts = [(item.backend, item.spec.cuda_context_bytes) for item in running]
    graphs = [
        (item.backend, item.spec.graphs)
        for item in running
        if item.spec.graphs and not item.spec.graphs_in_budget and item.plan.mode == "utilization"
    ]
    outside = used - shares - held
    parts = []
    if contexts:
        listing = ", ".join(f"{name} {bytes_to_gib(size):.2f} GiB" for name, size in contexts)
        parts.append(
            f"the CUDA context of each instance ({listing}), which vLLM creates before the "
            "start-up snapshot its --gpu-memory-utilization share is measured against "
            "(vllm/v1/worker/gpu_worker.py)"
        )
    if graphs:
        listing = ", ".join(f"{name} {bytes_to_gib(size):.2f} GiB" for name, size in graphs)
        parts.append(f"CUDA graphs captured outside the budget ({listing})")
    if held:
        parts.append(f"{bytes_to_gib(held):.2f} GiB held by backends without a model description")
    text = (
        f"their --gpu-memory-utilization shares add up to {100 * shares / total:.1f}% "
        f"({bytes_to_gib(shares):.2f} GiB) and {bytes_to_gib(outside + held):.2f} GiB "
        f"({100 * (outside + held) / total:.1f}%) sits outside the shares: " + "; ".join(parts)
    )
    excess_pct = 100 * used / total - target_pct
    pinned = [item for item in running if item.vram_pct is not None]
    if len(pinned) == 1:
        item = pinned[0]
        assert item.vram_pct is not None
        largest = math.floor((item.vram_pct - excess_pct) * 10) / 10
        kv_after = item.plan.kv_bytes - (item.vram_pct - largest) / 100 * total
        if largest > 0 and item.plan.mode == "utilization" and kv_after >= item.spec.kv_bytes:
            text += (
                f". The largest vram_pct for {item.backend} within the target is {largest:g} "
                f"(its KV cache {bytes_to_gib(kv_after):.2f} GiB)"
            )
        elif largest > 0:
            text += (
                f". Lowering {item.backend}'s vram_pct to {largest:g} would fit the target but "
                "leave its KV cache short of one request of max_model_len tokens"
            )
    elif len(pinned) > 1:
        total_pct = sum(item.vram_pct or 0.0 for item in pinned)
        text += (
            f". Their vram_pct add up to {total_pct:g}%: at most "
            f"{math.floor((total_pct - excess_pct) * 10) / 10:g}% stays within the target"
        )
    needed_pct = math.ceil(100 * used / total * 10) / 10
    return text + f"; or raise target_utilization_pct to at least {needed_pct:g}"


def _spec(
    settings: PlannedSettings, profile: Profile, backend: str, planned: PlannedModel
) -> InstanceSpec:
    """What the share plan sizes for `backend`, with the profile's choices for it."""
    config = settings.backends[backend]
    chosen = profile.models.get(backend)
    vram_pct = chosen.vram_pct if chosen is not None else None
    return instance_spec(
        planned,
        gpus=config.gpu_count,
        name=backend,
        cuda_graphs=chosen.cuda_graphs if chosen is not None else None,
        gpu_memory_utilization=None if vram_pct is None else vram_pct / 100,
    )


def _instance(
    settings: PlannedSettings,
    profile: Profile,
    gpu: int,
    backend: str,
    planned: PlannedModel,
    spec: InstanceSpec,
    plan: InstancePlan,
) -> PlannedInstance:
    """`backend` as planned on `gpu`: its share of the memory and its vLLM command."""
    config = settings.backends[backend]
    chosen = profile.models.get(backend)
    sleep = chosen.sleep_mode if chosen is not None else None
    if sleep is None:
        sleep = config.sleep_supported
    argv, env = vllm_command(
        config,
        planned,
        plan,
        sleep_mode=sleep,
        graphs_outside_budget=bool(spec.graphs) and not spec.graphs_in_budget,
    )
    return PlannedInstance(
        backend=backend,
        gpu=gpu,
        config=config,
        planned=planned,
        spec=spec,
        plan=plan,
        vram_pct=chosen.vram_pct if chosen is not None else None,
        sleep_mode=sleep,
        argv=argv,
        env=env,
    )

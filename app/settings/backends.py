"""One backend of `models.yaml`: its URL and names, how it is run (runtime), its lifecycle,
how it yields, its timeouts and its model description.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from app.planner.description import resolve
from app.planner.parallel import check_tensor_parallel
from app.settings.base import LOCAL_HOST, StrictConfig, http_url
from app.settings.endpoints import (
    RUNNER_APIS,
    TASK_APIS,
    TASK_RUNNER,
    Api,
    MessagesMode,
    Runner,
    Task,
    served_apis,
    with_messages,
)
from app.settings.hf_config import HfConfigField
from app.settings.model_info import ModelInfoConfig
from app.settings.placement import GpusSpec, check_runtime_gpus, command_tp, first_placed, gpu_count
from app.settings.runtimes import (
    ExternalRuntimeConfig,
    KubernetesRuntimeConfig,
    ProcessRuntimeConfig,
    RuntimeConfig,
)
from app.settings.timeouts import TimeoutOverridesConfig

logger = logging.getLogger(__name__)

# vLLM registers /v1/load_lora_adapter and /v1/unload_lora_adapter only with it set to 1 or
# true (vllm/envs.py; vllm/entrypoints/serve/lora/api_router.py).
LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# vLLM's sleep mode needs both: /sleep, /wake_up and /is_sleeping are registered only in
# dev mode (vllm/envs.py; vllm/entrypoints/serve/dev/sleep/api_router.py), and the engine
# flag sets up the cumem allocator that sleeps.
SLEEP_ENV = "VLLM_SERVER_DEV_MODE"
SLEEP_FLAG = "--enable-sleep-mode"


class ReleaseConfig(StrictConfig):
    """How a backend gives its VRAM back: for a yield (`yield:`), when idle past
    `idle_ttl_s` (`idle:`) and when admission evicts it for another start (`eviction:`).

    `sleep` uses vLLM's sleep mode (`POST /sleep?level=N`; the server needs
    `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`), which keeps the process and
    wakes in seconds; when the server does not offer it, the backend is stopped instead.
    Level 1 offloads the weights to pinned host RAM, level 2 discards them: both free the
    same GPU memory (weights and KV cache), level 2 also spares the host RAM.

    `auto` (the default): a backend with sleep mode (`BackendConfig.sleep_supported`)
    sleeps at level 1 while its weights fit its host's RAM budget (`host_ram:`), else at
    level 2, else it is stopped; a backend without sleep mode is stopped. `level` caps how
    deep `auto` goes (`level: 1`: level 1 or stop) and is the level of `sleep` (default 1).
    A level-1 sleep of either method is subject to the host RAM budget
    (`app.lifecycle.release`).
    """

    method: Literal["auto", "stop", "sleep"] = Field(
        "auto",
        description=(
            "auto: sleep while the weights fit the host RAM budget, else stop; stop; sleep: vLLM "
            "sleep mode."
        ),
    )
    level: Literal[1, 2] | None = Field(
        None,
        description=(
            "The sleep level of `sleep`, the deepest level `auto` may use (1 keeps the weights in "
            "host RAM, 2 drops them)."
        ),
    )

    @property
    def sleep_level(self) -> int:
        """The level of `sleep`, the deepest level of `auto`."""
        if self.level is not None:
            return self.level
        return 1 if self.method == "sleep" else 2


class BackendConfig(StrictConfig):
    url: str = Field(description="The server's base URL without /v1, like http://host:8000.")
    models: list[str] = Field(
        min_length=1, description="Model ids it serves; the first is the one sent upstream."
    )
    aliases: list[str] = Field(
        default_factory=list, description="More names clients may use for it."
    )
    # A replica group: backends with the same `replica_of` may list the same model ids and
    # aliases (they must send the same upstream id, `models[0]`, and serve the same APIs);
    # a request for such a name goes to one of them (app/routing/replicas.py).
    replica_of: str | None = Field(
        default=None,
        min_length=1,
        description="A replica group's name: backends with the same one may serve the same names.",
    )
    role: str | None = Field(
        None, description="A role name that cloud_providers.yaml chains may be keyed by."
    )
    # LoRA adapters: name -> path (vLLM's `lora_path`). Each name is a model name of its
    # own (routes, key scopes, /v1/models with `parent`), sent upstream as is and loaded on
    # first use with POST /v1/load_lora_adapter (the server needs --enable-lora and
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING=1). At most `max_loras` (vLLM's --max-loras,
    # default 1) stay loaded: the least recently used is unloaded first.
    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters: name -> path, loaded on first use (vLLM --enable-lora).",
    )
    max_loras: PositiveInt = Field(
        1,
        description=(
            "Adapters kept loaded at once (vLLM's --max-loras); the least recently used is "
            "unloaded."
        ),
    )
    # What it serves (app/settings/endpoints.py): `endpoints:` when listed, else what the
    # server's /openapi.json said (app/lifecycle/served.py), else vLLM's set for `task`,
    # else for `runner` (vLLM's --runner).
    runner: Runner = Field(
        "generate",
        description=(
            "vLLM's --runner: generate or pooling (which APIs it serves without endpoints or task)."
        ),
    )
    task: Task | None = Field(
        None,
        description=(
            "vLLM's task (generate, transcription, embed, classify, ...): the APIs it serves until "
            "the server says."
        ),
    )
    endpoints: list[Api] | None = Field(
        default=None,
        min_length=1,
        description="The APIs it serves, always winning over what the server says; null: learned.",
    )

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[Api] | None) -> list[Api] | None:
        return served_apis(value)

    # `/v1/messages`: `auto` passes it through to a generate runner (vLLM 0.33 serves it),
    # `translate` sends it as chat (an older vLLM image), `native` passes it through.
    messages: MessagesMode = Field(
        "auto",
        description="/v1/messages: auto as served, native passed through, translate sent as chat.",
    )
    # Lower a request's `max_tokens` (`max_completion_tokens`, `max_output_tokens`) above
    # the server's max_model_len to it (vLLM refuses it with a 400); `x-microscheduler-
    # max-tokens-lowered` says so. False: sent as the client wrote it.
    lower_max_tokens: bool = Field(
        True, description="Lower a request's max_tokens above the server's max_model_len to it."
    )
    runtime: RuntimeConfig = Field(
        default_factory=ExternalRuntimeConfig,
        description="How it is run: external, process, docker or kubernetes (`kind`).",
    )
    timeouts: TimeoutOverridesConfig = Field(
        default_factory=TimeoutOverridesConfig,
        description="Overrides of the top-level timeouts for this backend.",
    )
    health_path: str = Field("/health", description="The path whose 200 says the server is ready.")
    api_key_env: str | None = Field(
        None, description="The variable holding the server's --api-key, if it has one."
    )
    # None: a connection per request (vLLM takes them all; leases are the gateway's limit).
    # A number caps them; requests beyond wait, counted (requests_waiting{reason=
    # "connection_pool"}, upstream_pool_wait_seconds), within first_byte_s.
    max_connections: PositiveInt | None = Field(
        None, description="Cap on connections to it; null: one per request."
    )
    # None: no limit. A number caps the requests sent to it at once; the rest wait in its
    # queue by key priority, then arrival (requests_waiting{reason="max_inflight"}).
    max_inflight: PositiveInt | None = Field(
        None,
        description="Requests sent to it at once; the rest queue by key priority. null: no limit.",
    )
    # `priority`: requests carry vLLM's `priority` from the client key (the server needs
    # `--scheduling-policy priority`); `fcfs`: their bodies are relayed untouched.
    scheduling: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description=(
            "fcfs: bodies relayed untouched; priority: the key's priority sent as vLLM's "
            "`priority`."
        ),
    )
    # Lifecycle (see docs/lifecycle.md): `pinned` runs all the time; `lazy` starts
    # on its first request; `standby` is started once at gateway start and put to sleep
    # (level 1) as soon as it is ready, so its first request costs a wake, not a cold start
    # (it needs vLLM's sleep mode: VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode), and is
    # evicted like a lazy one.
    lifecycle: Literal["pinned", "lazy", "standby"] = Field(
        "pinned",
        description=(
            "pinned: always running; lazy: started on its first request; standby: loaded at start, "
            "then asleep."
        ),
    )
    idle_ttl_s: NonNegativeFloat = Field(
        0.0, description="Stop (or sleep) after this many seconds without requests; 0: never."
    )
    # Lazy only: once ready, another model's start does not evict it for this long (it
    # waits instead, up to its own start_timeout_s), even when idle. A zone or a yield
    # still evicts it; idle_ttl_s still stops it. 0: no protection.
    min_resident_s: NonNegativeFloat = Field(
        0.0, description="Lazy or standby: once ready, not evicted for another start this long."
    )
    # Lazy only: how long, from its ready, it keeps the GPU against a start of equal
    # priority while requests keep it busy (the other model's requests wait, each up to its
    # max_wait_s). An idle backend is evicted by equals at once (past min_resident_s), a
    # busy one after this (its requests drained first). So two models that do not fit
    # together and take turns serve their requests in batches instead of swapping at every
    # request. 0: a busy equal is evicted at once (drained): a swap at every turn.
    max_hold_s: NonNegativeFloat = Field(
        30.0, description="Lazy: while busy, kept this long against a start of equal priority."
    )
    priority: int = Field(
        50,
        description=("Admission evicts backends of lower priority first to make room for a start."),
    )
    # The machine whose GPUs it uses: a name in `hosts:`; none: the gateway's own (the
    # top-level docker: and gpu:). A kubernetes backend with a host is admitted on that
    # host's GPUs; without one, the cluster's scheduler places it.
    host: str | None = Field(
        default=None,
        min_length=1,
        description="The machine whose GPUs it uses: a name in hosts:; null: the gateway's own.",
    )
    vram_mib: PositiveInt | None = Field(
        None, description="Its expected footprint per GPU in MiB, for admission."
    )
    # A list: those GPUs; `auto` or a count: chosen at each start (app.settings.placement).
    gpus: GpusSpec = Field(
        default_factory=lambda: [0],
        description=(
            "The GPU indexes it occupies; auto (or a count): chosen at each start among its "
            "host's GPUs with room."
        ),
    )
    tensor_parallel_size: PositiveInt | None = Field(
        None, description="GPUs one instance spreads over (vLLM's --tensor-parallel-size)."
    )
    start_timeout_s: PositiveFloat = Field(
        300.0, description="Its health check must answer 200 within this after a start."
    )
    max_waiting: NonNegativeInt = Field(
        64, description="Requests held for it at once (waking, or for a slot); more get 503."
    )
    max_wait_s: PositiveFloat = Field(
        120.0,
        description=(
            "A held request waits at most this long, then 504 (503 when it waited for a slot)."
        ),
    )
    drain_timeout_s: NonNegativeFloat = Field(
        60.0, description="A stop waits this long for the requests in flight."
    )
    yield_: ReleaseConfig = Field(
        default_factory=ReleaseConfig,
        alias="yield",
        description="How POST /vram/yield frees its VRAM.",
    )
    idle: ReleaseConfig = Field(
        default_factory=ReleaseConfig, description="How the idle_ttl_s stop frees its VRAM."
    )
    eviction: ReleaseConfig = Field(
        default_factory=ReleaseConfig, description="How admission frees its VRAM for another start."
    )
    # Whether its server offers vLLM sleep mode (VLLM_SERVER_DEV_MODE=1 and
    # --enable-sleep-mode), which `auto` release methods use; None: inferred
    # (`sleep_supported`).
    sleep_mode: bool | None = Field(
        None, description="Whether its server offers vLLM sleep mode; null: inferred."
    )
    # MiB it keeps on each GPU while asleep (CUDA context, graphs: 0.5-6 GiB), counted by
    # admission when the probe did not show what its sleep freed; None: its whole footprint.
    asleep_mib: NonNegativeInt | None = Field(
        None,
        description=(
            "MiB it keeps on each GPU while asleep, when the probe cannot show it; null: its whole "
            "footprint."
        ),
    )
    # The sleep guard (app.lifecycle.sleep_guard): a sleep that holds this many MiB more
    # asleep than its first since the last cold start (as the probe measured what each
    # freed) stops the backend instead, and its next request starts it cold. 0: never.
    sleep_leak_mib: NonNegativeInt = Field(
        512,
        description=(
            "Stopped instead of left asleep once a sleep holds more than this many MiB more "
            "than its first since a cold start (measured); 0: never."
        ),
    )
    # What the model is and how it is served, for the planner (app/planner/description.py):
    # the admission footprint without vram_mib, and `microscheduler plan profile`.
    model_info: ModelInfoConfig | None = Field(
        None,
        description=(
            "What the model is and how it is served, for the planner (footprint without vram_mib)."
        ),
    )
    hf_config: HfConfigField = Field(
        None,
        description="A Hugging Face config.json (or its folder), relative to the config directory.",
    )

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = http_url(
            value,
            like="an http(s) base URL like http://host:8000",
            plain=True,
            credentials="name the variable holding the server's key in api_key_env",
        )
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            raise ValueError("is the server's base URL without /v1 (the gateway adds /v1/...)")
        return value.rstrip("/")

    @field_validator("models", "aliases")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name.strip():
                raise ValueError("names must be non-empty strings")
        return names

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, adapters: dict[str, str]) -> dict[str, str]:
        for name, path in adapters.items():
            if not name.strip() or not path.strip():
                raise ValueError("adapter names and paths must be non-empty strings")
        return adapters

    @model_validator(mode="before")
    @classmethod
    def _described_by_a_file(cls, data: Any) -> Any:
        """`hf_config:` alone describes the model with every `model_info:` default."""
        if isinstance(data, dict) and data.get("hf_config") and data.get("model_info") is None:
            return {**data, "model_info": {}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _runner_of_task(cls, data: Any) -> Any:
        """`task:` alone runs on its vLLM runner. `runner: transcription` (a name of the
        gateway's, not vLLM's): vLLM's generate runner with the `transcription` task, read
        as that with a warning."""
        if not isinstance(data, dict):
            return data
        task = data.get("task")
        if data.get("runner") is None and isinstance(task, str) and task in TASK_RUNNER:
            return {**data, "runner": TASK_RUNNER[task]}
        if data.get("runner") != "transcription":
            return data
        if data.get("task") not in (None, "transcription"):
            raise ValueError(
                f"runner: transcription is not a vLLM runner (--runner is generate or "
                f"pooling) and contradicts task: {data['task']}; a transcription model is "
                "`runner: generate` with `task: transcription`"
            )
        logger.warning(
            "runner: transcription is deprecated (not a vLLM --runner): read as runner: "
            "generate with task: transcription; write that in models.yaml"
        )
        return {**data, "runner": "generate", "task": "transcription"}

    @model_validator(mode="after")
    def _runner_and_task(self) -> BackendConfig:
        if self.task is not None:
            wanted = TASK_RUNNER[self.task]
            if self.runner != wanted:
                raise ValueError(
                    f"task: {self.task} runs on vLLM's {wanted} runner, not runner: "
                    f"{self.runner} (leave runner: out, or set it to {wanted})"
                )
        return self

    @model_validator(mode="after")
    def _messages_or_endpoints(self) -> BackendConfig:
        if self.endpoints is not None and self.messages != "auto":
            raise ValueError(
                f"messages: {self.messages} with endpoints: the list says it all (list "
                "messages in endpoints: to pass /v1/messages through, leave it out to "
                "translate it to chat)"
            )
        return self

    @model_validator(mode="after")
    def _lifecycle(self) -> BackendConfig:
        if isinstance(self.runtime, KubernetesRuntimeConfig):
            self._scaled_externally(self.runtime)
        if not self.gpus_accounted:
            placed = sorted({"vram_mib", "gpus", "asleep_mib"} & self.model_fields_set)
            if placed:
                raise ValueError(
                    f"{', '.join(placed)}: a kubernetes backend without host: runs on the "
                    "cluster's GPUs, which its scheduler places and the device plugin "
                    "accounts: the gateway's admission does not count it (remove the key, "
                    "or name the node in host: to admit it on that host's GPUs)"
                )
        if self.lifecycle in ("lazy", "standby"):
            if self.runtime.kind == "external":
                raise ValueError(
                    f"lifecycle: {self.lifecycle} needs a runtime the gateway can start "
                    "(docker, process or kubernetes), not external"
                )
            if (
                self.gpus_accounted
                and self.vram_mib is None
                and self.model_info is None
                and self.hf_config is None
            ):
                raise ValueError(
                    f"vram_mib: is required for lifecycle: {self.lifecycle} (used for "
                    "admission), unless model_info: or hf_config: describes the model to plan "
                    "it from"
                )
        elif self.min_resident_s > 0:
            raise ValueError(
                "min_resident_s: applies to lifecycle: lazy or standby only (a pinned backend "
                "is never evicted for another model)"
            )
        if self.asleep_mib is not None and self.asleep_mib > (self.vram_mib or self.asleep_mib):
            raise ValueError(
                f"asleep_mib: {self.asleep_mib} is more than vram_mib: {self.vram_mib} "
                "(what it keeps asleep is part of what it holds awake)"
            )
        clash = sorted(set(self.adapters) & {*self.models, *self.aliases})
        if clash:
            raise ValueError(f"adapters: {', '.join(clash)} is also a model id or alias here")
        check_runtime_gpus(self.gpus, self.tensor_parallel_size, self.runtime)
        # A description must be usable, and split over its GPUs as vLLM splits the model.
        if (planned := resolve(self.model_info, self.hf_config)) is not None:
            check_tensor_parallel(planned.model, self.gpu_count, planned.source)
        return self

    def _scaled_externally(self, runtime: KubernetesRuntimeConfig) -> None:
        """`scale: external`: what the gateway cannot do to a workload it does not scale."""
        if runtime.scale != "external":
            return
        if self.idle_ttl_s > 0:
            raise ValueError(
                f"idle_ttl_s: {self.idle_ttl_s:g} with runtime.scale: external: the gateway "
                "does not scale it down, its owner (KEDA/HPA) does when it is idle (its "
                "cooldown); remove idle_ttl_s"
            )
        if self.host is not None:
            raise ValueError(
                f"host: {self.host} with runtime.scale: external: admission on that host's "
                "GPUs could not evict it or free its memory, since the gateway does not scale "
                "it (remove host:, so the cluster's scheduler places it, or use scale: gateway)"
            )

    @property
    def host_name(self) -> str:
        """The host whose GPUs it uses (`local`: the gateway's own machine)."""
        return self.host or LOCAL_HOST

    @property
    def fixed_gpus(self) -> tuple[int, ...] | None:
        """The GPUs it always uses (`gpus:` a list); None: chosen at each start."""
        return tuple(self.gpus) if isinstance(self.gpus, list) else None

    @property
    def first_gpus(self) -> tuple[int, ...]:
        """Its `gpus:` list, else its first Docker placement's, else its first N GPUs."""
        return self.fixed_gpus or first_placed(self.runtime) or tuple(range(self.gpu_count))

    @property
    def gpu_count(self) -> int:
        """How many GPUs one instance of it uses (its tensor-parallel size)."""
        return gpu_count(self.gpus, self.tensor_parallel_size or command_tp(self.runtime))

    @property
    def gpus_accounted(self) -> bool:
        """Whether the gateway accounts its GPUs (admission, zones and the yield of its
        host count it): not a kubernetes backend without `host:`, which runs where the
        cluster's scheduler puts it."""
        return self.runtime.kind != "kubernetes" or self.host is not None

    @property
    def apis(self) -> frozenset[Api]:
        """The APIs requests may use on this backend as configured: `endpoints:`, else
        vLLM's set for `task:`, else for `runner:`. What it serves once the server said so
        is `Backend.serving` (app/lifecycle/served.py), which only `endpoints:` overrides."""
        if self.endpoints is not None:
            return frozenset(self.endpoints)
        base = TASK_APIS[self.task] if self.task is not None else RUNNER_APIS[self.runner]
        return with_messages(base, self.messages)

    @property
    def weights_bytes(self) -> int | None:
        """What its weights weigh, as far as the configuration tells: the checkpoint of its
        model description (`model_info:`/`hf_config:`), else `vram_mib` on each of its GPUs
        (weights plus KV cache: more than the weights, which errs towards a longer control
        timeout), else None."""
        planned = resolve(self.model_info, self.hf_config)
        if planned is not None:
            return planned.weight_bytes
        if self.vram_mib is not None:
            return self.vram_mib * self.gpu_count * 1024 * 1024
        return None

    @property
    def sleep_supported(self) -> bool:
        """Whether its server offers sleep mode: `sleep_mode:` when set; else a process
        runtime whose `env:` sets VLLM_SERVER_DEV_MODE=1 and whose command has
        --enable-sleep-mode (vLLM needs both: reference/vllm-0.33.md), or any of
        `yield:`/`idle:`/`eviction:` with `method: sleep` (the config says it sleeps).
        A container's environment is not seen here: say `sleep_mode: true`."""
        if self.sleep_mode is not None:
            return self.sleep_mode
        if not self.managed:
            return False
        if any(how.method == "sleep" for how in (self.yield_, self.idle, self.eviction)):
            return True
        runtime = self.runtime
        if isinstance(runtime, ProcessRuntimeConfig):
            dev = runtime.env.get(SLEEP_ENV, "").strip().lower() in ("1", "true")
            return dev and SLEEP_FLAG in runtime.command
        return False

    @property
    def managed(self) -> bool:
        return self.runtime.kind != "external"

    @property
    def names(self) -> list[str]:
        """Every model name it serves: its ids, aliases and LoRA adapters."""
        return [*self.models, *self.aliases, *self.adapters]

    def lora_warning(self) -> str | None:
        """Why its adapters may not load, when its configuration shows it: a process
        backend whose `env:` lacks VLLM_ALLOW_RUNTIME_LORA_UPDATING (vLLM registers
        /v1/load_lora_adapter only with it; a container's environment is not seen here)."""
        if not self.adapters or not isinstance(self.runtime, ProcessRuntimeConfig):
            return None
        value = self.runtime.env.get(LORA_ENV, "").strip().lower()
        if value in ("1", "true"):
            return None
        return (
            f"adapters: {', '.join(self.adapters)} are loaded at runtime, but runtime.env does "
            f"not set {LORA_ENV}=1: vLLM then has no /v1/load_lora_adapter and requests for "
            "them fail"
        )

    def sleep_mode_warning(self) -> str | None:
        """Why a `standby` backend may not sleep, when its configuration shows it: a process
        backend whose `env:` lacks VLLM_SERVER_DEV_MODE=1 or whose command lacks
        --enable-sleep-mode (vLLM then has no /sleep, or refuses it: the backend is stopped
        after its first load instead, and its first request is a cold start). A container's
        environment and command are not seen here."""
        if self.lifecycle != "standby" or not isinstance(self.runtime, ProcessRuntimeConfig):
            return None
        missing = []
        if self.runtime.env.get(SLEEP_ENV, "").strip().lower() not in ("1", "true"):
            missing.append(f"runtime.env does not set {SLEEP_ENV}=1")
        if SLEEP_FLAG not in self.runtime.command:
            missing.append(f"runtime.command lacks {SLEEP_FLAG}")
        if not missing:
            return None
        return (
            f"lifecycle: standby needs vLLM's sleep mode, but {' and '.join(missing)}: it "
            "would be stopped after its first load instead of put to sleep, and its first "
            "request would be a cold start"
        )

    def warnings(self) -> list[str]:
        """What `check-config` says about it beyond errors (each `key: ...`)."""
        found = (self.lora_warning(), self.sleep_mode_warning())
        return [w for w in found if w is not None]

    @property
    def served_model(self) -> str:
        """The id sent upstream, whatever name the client used."""
        return self.models[0]

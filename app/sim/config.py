"""The fake vLLM server's options (its CLI flags, one to one) and the faults a test can
change while it runs (`POST /_fake/faults`); `FaultOptions`, the part of those faults the
fake Anthropic API (app.sim.anthropic) has too."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar


@dataclass
class FakeConfig:
    """All options of the fake server (CLI flags map 1:1, dashes to underscores)."""

    host: str = "127.0.0.1"
    port: int = 8000
    backlog: int = 2048  # the listen queue (uvicorn's default, which vLLM runs with)
    models: list[str] = field(default_factory=lambda: ["fake-model"])
    startup_delay: float = 0.0
    # Print vLLM 0.33's start-up lines over startup_delay (app.sim.startup_log).
    print_startup_log: bool = False
    # Fail like vLLM's KV-cache check: its lines, then exit 1 (implies the start-up lines).
    fail_kv_cache: bool = False
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    max_tokens: int = 16
    max_model_len: int = 8192
    # The answer ends (finish_reason `stop`) after this many tokens, as a model's does when
    # it writes its end-of-sequence token; None: it fills max_tokens (`length`).
    eos_after: int | None = None
    max_num_seqs: int = 256
    scheduling_policy: str = "fcfs"  # vLLM's --scheduling-policy: fcfs | priority
    # The model's task (vLLM's supported task; app.sim.routes.TASKS): its routes only.
    # None: the fake's permissive default, every task's routes at once (no vLLM does that).
    task: str | None = None
    num_labels: int = 2  # a classify model's labels; 1 adds /score and /rerank (vLLM's rule)
    api_key: list[str] | None = None  # vLLM's --api-key (Bearer, /v1 /v2 /inference /cohere)
    disable_fastapi_docs: bool = False  # vLLM's flag: no /openapi.json
    # The first GET /openapi.json answers this late (FastAPI builds the schema then);
    # the later ones at once.
    openapi_delay: float = 0.5
    # vLLM's --enable-auto-tool-choice and --tool-call-parser: tool calls (app.sim.tools);
    # without both, `tools` with tool_choice auto (their default), required or named: 400.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    allow_runtime_lora: bool | None = None  # None: read VLLM_ALLOW_RUNTIME_LORA_UPDATING
    # Keep responses (`store`): None reads VLLM_ENABLE_RESPONSES_API_STORE when the app is
    # built; off, like vLLM's default (`store` silently ignored, follow-ups 404).
    responses_store: bool | None = None
    embedding_dim: int = 8
    fail_status: int | None = None
    fail_count: int | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False
    health_status: int | None = None
    ignore_sigterm: bool = False
    dev_mode: bool | None = None  # None: read VLLM_SERVER_DEV_MODE when the app is built
    version: str = "0.0.0-fake"
    # GPU footprint reported to the simulated GPU's ledger (app.sim.vram)
    vram_mib: int = 0  # while awake; 0 reports nothing
    vram_asleep_mib: int | None = None  # while asleep (level 1 or 2); None: vram_mib // 8
    sim_gpu_dir: str | None = None  # the ledger directory; None reports nothing
    gpus: list[int] = field(default_factory=lambda: [0])
    # vLLM's --enable-sleep-mode: accepted (sleep mode here needs VLLM_SERVER_DEV_MODE=1 only).
    enable_sleep_mode: bool = False
    # The modelled time of a wake: the weights (`weights_mib`; None: what a sleep frees,
    # --vram-mib minus the asleep footprint) copied back at this rate, in GiB/s, by a level-1
    # `/wake_up` and read again by a level-2 `reload_weights`. 0: instant.
    wake_gib_per_s: float = 0.0
    weights_mib: int | None = None
    # vLLM's sleep leaks (vLLM #21336): each sleep/wake cycle leaves this many MiB more held
    # while asleep (app.sim.vram), up to the awake footprint. 0: none.
    sleep_leak_mib: int = 0
    # A bad wake (vLLM #50011, #48680): after this many sleep/wake cycles, every /wake_up
    # answers 500 as vLLM does when the engine's wake_up raises, and the server stays
    # asleep. None: wakes never fail.
    wake_fail_after: int | None = None

    @property
    def tool_calling(self) -> bool:
        """Whether the server parses tool calls (vLLM needs both flags)."""
        return self.enable_auto_tool_choice and self.tool_call_parser is not None

    def wake_s(self) -> float:
        """Seconds a wake of the weights takes (0: not modelled)."""
        if self.wake_gib_per_s <= 0:
            return 0.0
        weights = self.weights_mib
        if weights is None:
            asleep = self.vram_asleep_mib
            weights = self.vram_mib - (self.vram_mib // 8 if asleep is None else asleep)
        return max(0, weights) / 1024 / self.wake_gib_per_s

    def faults(self) -> Faults:
        return Faults(**{f.name: getattr(self, f.name) for f in fields(Faults)})


@dataclass
class FaultOptions:
    """What both fakes (vLLM's, Anthropic's) share of their runtime faults: the next requests
    fail with `fail_status` (`fail_count` of them; None: all), and a patch (``POST
    /_fake/faults``) is validated whole before any of it applies (null = the default).

    Every option not listed in `_FLAGS` or `_NUMBERS` is a non-negative integer; those in
    `_STATUSES` an HTTP status code. A subclass checks options of other kinds in
    `_checked`."""

    fail_status: int | None = None
    fail_count: int | None = None

    _FLAGS: ClassVar[tuple[str, ...]] = ("stall_before_headers",)
    _NUMBERS: ClassVar[tuple[str, ...]] = ("ttft",)
    _STATUSES: ClassVar[tuple[str, ...]] = ("fail_status",)

    def take_failure(self) -> int | None:
        """Status to fail the next request with, consuming fail_count."""
        status = self.fail_status
        if status is None or self.fail_count is None:
            return status
        if self.fail_count <= 0:
            return None
        self.fail_count -= 1
        if self.fail_count == 0:
            self.fail_status = self.fail_count = None
        return status

    def update(self, patch: dict[str, Any]) -> None:
        """Validate all of ``patch`` first, then apply it; raises ValueError."""
        specs = {f.name: f for f in fields(self)}
        new: dict[str, Any] = {}
        for key, value in patch.items():
            spec = specs.get(key)
            if spec is None:
                raise ValueError(f"unknown fault option {key!r}")
            if value is None:
                factory = spec.default_factory
                new[key] = factory() if callable(factory) else spec.default
            else:
                new[key] = self._checked(key, value)
        for key, value in new.items():
            setattr(self, key, value)

    def update_json(self, raw: bytes) -> None:
        """`update` from a request body (empty: nothing changes); raises ValueError."""
        patch = json.loads(raw or b"{}")
        if not isinstance(patch, dict):
            raise ValueError("body must be a JSON object")
        self.update(patch)

    def _checked(self, key: str, value: object) -> Any:
        if key in self._FLAGS:
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be a boolean")
            return value
        if key in self._NUMBERS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key} must be a number")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{key} must be >= 0")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be a non-negative integer")
        if key in self._STATUSES and not 100 <= value <= 599:
            raise ValueError(f"{key} must be an HTTP status code")
        return value

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Faults(FaultOptions):
    """The fake vLLM server's runtime-adjustable behaviour (`FaultOptions`)."""

    drop_after: int | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    health_status: int | None = None

    _NUMBERS: ClassVar[tuple[str, ...]] = ("ttft", "tokens_per_second")
    _STATUSES: ClassVar[tuple[str, ...]] = ("fail_status", "health_status")

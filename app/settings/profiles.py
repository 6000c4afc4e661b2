"""GPU profiles (`gpu_profiles.yaml`): named presets of which backends run and how much of
the GPU each gets. The schema; switching lives in `app/lifecycle/profile_switch.py`.

```yaml
profiles:
  dev:
    vram_strategy: shared
    gpu_total_gb: 32
    target_utilization_pct: 76
    models:
      orchestrator: {vram_pct: 40, cuda_graphs: true}
      reasoning: {enabled: true, vram_pct: 35, sleep_mode: true}
  production:
    target_utilization_pct: 92
    models:
      orchestrator: {vram_pct: 92}
      reasoning: {enabled: false}
active: dev
```

A backend a profile does not list keeps its `models.yaml` behaviour (enabled). In a
profile, `vram_pct` is the share of the GPU's memory the instance is planned to use (its
`--gpu-memory-utilization` x 100); the enabled shares add up to no more than
`target_utilization_pct`. `sleep_mode: true` makes the backend yield by vLLM sleep mode
instead of a stop; `cuda_graphs: false` plans it with `--enforce-eager`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, model_validator

from app.settings.base import StrictConfig

Percent = Annotated[float, Field(gt=0, le=100)]
# Rounding slack when shares are compared with the target (40 + 35 + 1 written as floats).
_PCT_SLACK = 1e-9


class ProfileModelConfig(StrictConfig):
    enabled: bool = Field(True, description="Whether the backend runs in this profile.")
    vram_pct: Percent | None = Field(
        None, description="Its planned share of the GPU's memory (--gpu-memory-utilization x 100)."
    )
    cuda_graphs: bool | None = Field(
        None, description="null: as the backend is configured; false plans --enforce-eager."
    )
    sleep_mode: bool | None = Field(
        None,
        description="Yield by vLLM sleep mode instead of a stop; null: the backend's yield.method.",
    )
    container: str | None = Field(
        None, description="Informational; the backend's runtime names its container."
    )


class ProfileConfig(StrictConfig):
    description: str | None = Field(None, description="What the profile is for.")
    # shared: several instances share the GPU; exclusive: one instance owns it.
    vram_strategy: Literal["shared", "exclusive"] = Field(
        "shared", description="shared: several instances share the GPU; exclusive: one owns it."
    )
    gpu_total_gb: PositiveFloat | None = Field(
        None, description="The GPU's memory in GB; null: what the probe sees."
    )
    target_utilization_pct: Percent = Field(
        90.0, description="The enabled vram_pct add up to at most this."
    )
    models: dict[str, ProfileModelConfig] = Field(
        default_factory=dict,
        description=(
            "Per backend: enabled and its share; a backend not listed keeps its models.yaml "
            "behaviour."
        ),
    )

    @model_validator(mode="after")
    def _shares(self) -> ProfileConfig:
        enabled = {n: m for n, m in self.models.items() if m.enabled}
        planned = {n: m.vram_pct for n, m in enabled.items() if m.vram_pct is not None}
        total = sum(planned.values())
        if total > self.target_utilization_pct + _PCT_SLACK:
            parts = " + ".join(f"{n} {p:g}" for n, p in planned.items())
            raise ValueError(
                f"models: the enabled vram_pct add up to {total:g}% ({parts}), more than "
                f"target_utilization_pct {self.target_utilization_pct:g}%"
            )
        if self.vram_strategy == "exclusive" and len(planned) > 1:
            raise ValueError(
                "vram_strategy: exclusive gives the GPU to one instance, but "
                f"{len(planned)} enabled models have a vram_pct: {', '.join(planned)}"
            )
        return self

    def enabled(self, backend: str) -> bool:
        model = self.models.get(backend)
        return model is None or model.enabled

    def planned_mib(self, backend: str, gpu_total_mib: int | None) -> int | None:
        """The MiB this profile plans for `backend`, or None when it plans nothing."""
        model = self.models.get(backend)
        if model is None or not model.enabled or model.vram_pct is None:
            return None
        total = gpu_total_mib if self.gpu_total_gb is None else int(self.gpu_total_gb * 1024)
        if total is None:
            return None
        return int(total * model.vram_pct / 100)


class GpuProfilesConfig(StrictConfig):
    profiles: dict[str, ProfileConfig] = Field(min_length=1, description="GPU profiles by name.")
    active: str | None = Field(
        None, description="The profile in force at start; null: the first one."
    )

    @model_validator(mode="after")
    def _active_exists(self) -> GpuProfilesConfig:
        if self.active is not None and self.active not in self.profiles:
            raise ValueError(
                f"active: {self.active!r} is not a profile (profiles: {', '.join(self.profiles)})"
            )
        return self

    @property
    def default(self) -> str:
        return self.active if self.active is not None else next(iter(self.profiles))

    def unknown_backends(self, backends: Iterable[str]) -> list[str]:
        """`profiles.<p>.models.<name>` lines naming backends that do not exist."""
        known = set(backends)
        return [
            f"profiles.{p}.models.{name}"
            for p, profile in self.profiles.items()
            for name in profile.models
            if name not in known
        ]

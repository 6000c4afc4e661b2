"""How a backend is run (`runtime:`): an external server, a process, a Docker container
through the socket proxy, or a Kubernetes Deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    model_validator,
)

from app.settings.base import StrictConfig


class ExternalRuntimeConfig(StrictConfig):
    """A server we do not manage: health-checked only."""

    kind: Literal["external"] = Field(
        "external",
        description="external: a server the gateway does not manage, health-checked only.",
    )


class ProcessRuntimeConfig(StrictConfig):
    """A command started by the gateway and stopped (whole process group) by it."""

    kind: Literal["process"] = Field(
        description="process: a command the gateway starts and stops (its whole process group)."
    )
    command: list[str] = Field(
        min_length=1,
        description=(
            "The command and its arguments; `{python}` as the first word is the gateway's "
            "interpreter."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables added to the gateway's environment for the command.",
    )
    cwd: Path | None = Field(
        None, description="Working directory of the command; null: the gateway's."
    )
    stop_grace_s: PositiveFloat = Field(
        10.0, description="SIGTERM to the process group, SIGKILL after this many seconds."
    )


class DockerPlacement(StrictConfig):
    """One created container of a Docker backend and the GPUs it was created with."""

    gpus: list[NonNegativeInt] = Field(
        min_length=1, description="The GPUs the container was created with (--gpus device=...)."
    )
    container: str = Field(min_length=1, description="The container's name.")


class DockerRuntimeConfig(StrictConfig):
    """An existing container, started and stopped through the Docker Engine API.

    `stop_timeout_s` is Docker's `t`: how long the container gets after SIGTERM before
    the engine kills it (vLLM needs a few seconds to free the GPU cleanly).
    """

    kind: Literal["docker"] = Field(
        description=(
            "docker: an existing container, started and stopped through the Docker Engine API."
        )
    )
    container: str | None = Field(
        None,
        min_length=1,
        description="The container's name (create it with compose); or give placements.",
    )
    # One created container per set of GPUs: the backend's `gpus: auto` (or a count) is
    # chosen among them at each start (app.settings.placement).
    placements: list[DockerPlacement] | None = Field(
        None,
        min_length=1,
        description=(
            "Containers created on different GPUs (--gpus device=N): the gateway starts the one "
            "whose GPUs have room; with gpus: auto."
        ),
    )
    # Bounded: socket proxies cut requests after 10 minutes, and a stop call lasts `t`.
    stop_timeout_s: Annotated[int, Field(ge=0, le=300)] = Field(
        30, description="Docker's `t`: seconds after SIGTERM before the engine kills the container."
    )

    @model_validator(mode="after")
    def _one_way(self) -> DockerRuntimeConfig:
        if self.container is not None and self.placements is not None:
            raise ValueError("give container: or placements:, not both")
        if self.container is None and self.placements is None:
            raise ValueError(
                "container: is required (the container's name), or placements: (one created "
                "container per set of GPUs)"
            )
        return self

    def container_on(self, gpus: tuple[int, ...] | None) -> str:
        """The container to run on `gpus` (sorted; None: the one container)."""
        if self.container is not None:
            return self.container
        assert self.placements is not None  # one of the two (`_one_way`)
        if gpus is None:
            return self.placements[0].container
        for placement in self.placements:
            if tuple(sorted(placement.gpus)) == gpus:
                return placement.container
        raise KeyError(gpus)

    @property
    def containers(self) -> list[str]:
        """Every container it may run."""
        if self.placements is None:
            return [self.container] if self.container else []
        return [p.container for p in self.placements]


class KubernetesRuntimeConfig(StrictConfig):
    """An existing Deployment or StatefulSet (exactly one), scaled between 0 and 1 replica
    through its `scale` subresource; ready once its Service has a ready endpoint.

    `service` (default: the workload's name) is the Service whose EndpointSlices say
    when a pod is ready. `stop_timeout_s` bounds the wait for its pods to go after the
    scale to 0 (their terminationGracePeriodSeconds, 30 s by default, plus slack).

    `scale`: who writes its replica count. `gateway` (default): the gateway scales it
    0 <-> 1. `external`: another owner does (KEDA, an HPA); the gateway never patches it
    (its Role needs no `patch` on `*/scale`), holds requests until the owner has scaled it
    up and it is ready (`requests_waiting{reason="wake"}` is what KEDA scales on), and a
    stop only stops sending it requests. See app/runtimes/kubernetes.py.
    """

    kind: Literal["kubernetes"] = Field(
        description=(
            "kubernetes: an existing Deployment or StatefulSet scaled between 0 and 1 replica."
        )
    )
    namespace: str = Field(min_length=1, description="The workload's namespace.")
    deployment: str | None = Field(
        default=None,
        min_length=1,
        description="The Deployment's name (exactly one of deployment and statefulset).",
    )
    statefulset: str | None = Field(
        default=None,
        min_length=1,
        description="The StatefulSet's name (exactly one of deployment and statefulset).",
    )
    service: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "The Service whose ready endpoints say the pod is ready; null: the workload's name."
        ),
    )
    stop_timeout_s: PositiveFloat = Field(
        120.0, description="How long a stop waits for the pods to go after the scale to 0."
    )
    scale: Literal["gateway", "external"] = Field(
        "gateway",
        description=(
            "gateway: the gateway scales it 0 <-> 1; external: another owner (KEDA, an HPA) does."
        ),
    )

    @model_validator(mode="after")
    def _one_workload(self) -> KubernetesRuntimeConfig:
        if (self.deployment is None) == (self.statefulset is None):
            raise ValueError("needs exactly one of deployment: NAME or statefulset: NAME")
        return self

    @property
    def resource(self) -> str:
        """The workload's resource name in the `apps` group: deployments or statefulsets."""
        return "deployments" if self.deployment is not None else "statefulsets"

    @property
    def name(self) -> str:
        name = self.deployment or self.statefulset
        assert name is not None
        return name

    @property
    def service_name(self) -> str:
        return self.service or self.name


RuntimeConfig = Annotated[
    ExternalRuntimeConfig | ProcessRuntimeConfig | DockerRuntimeConfig | KubernetesRuntimeConfig,
    Field(discriminator="kind"),
]

"""Where the gateway's backends run: the Docker Engine and the GPUs of a host, the
Kubernetes API server, and `hosts:` (other machines, each with its own Docker proxy and
GPU probe; the local host is the top-level `docker:` and `gpu:`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from app.settings.backends import BackendConfig
from app.settings.base import LOCAL_HOST, StrictConfig, http_url, no_credentials


class DockerConfig(StrictConfig):
    """How to reach the Docker Engine API: a socket proxy URL or a Unix socket."""

    url: str = Field(
        "unix:///var/run/docker.sock",
        description="The Docker Engine API: a socket proxy URL or unix:///path/to/docker.sock.",
    )
    timeout_s: PositiveFloat = Field(
        10.0,
        description=(
            "Connect and read timeout of each Docker call, except a stop (which waits t more)."
        ),
    )

    @field_validator("url")
    @classmethod
    def _docker_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"a unix URL needs a socket path, got {value!r}")
        elif parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be a socket proxy URL like http://docker-proxy:2375 or a Unix socket "
                f"like unix:///var/run/docker.sock, got {value!r}"
            )
        no_credentials(parts, instead="reach the proxy over a private link (see Hosts)")
        return value.rstrip("/")


class KubernetesConfig(StrictConfig):
    """How to reach the Kubernetes API server, for `runtime: {kind: kubernetes}` backends.

    `kubeconfig`: a kubeconfig file (its current context); without it `$KUBECONFIG`, then
    the pod's ServiceAccount (in-cluster). `api_url` replaces the server of either, for
    example `http://127.0.0.1:8001` behind `kubectl proxy` (no credentials needed then).
    """

    kubeconfig: Path | None = Field(
        None, description="A kubeconfig file; null: $KUBECONFIG, then the pod's ServiceAccount."
    )
    api_url: str | None = Field(
        None,
        description=(
            "Replaces the kubeconfig's server, e.g. http://127.0.0.1:8001 behind kubectl proxy."
        ),
    )
    timeout_s: PositiveFloat = Field(
        10.0, description="Connect and read timeout of each call, except watches."
    )

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        like = "the API server's URL like https://10.0.0.1:6443 or http://127.0.0.1:8001 "
        http_url(
            value,
            like=like + "(kubectl proxy)",
            credentials="give a token in the kubeconfig (kubernetes.kubeconfig)",
        )
        return value.rstrip("/")


class SimGpuConfig(StrictConfig):
    """The simulated GPU of the demo and the tests.

    With `ledger_dir`, its used memory is what the fake vLLM servers report there
    (`--sim-gpu-dir`; a sleeping one reports less), measured like NVML would. Without
    it, used memory is what the gateway placed (the `vram_mib` of running backends plus
    zone holds).
    """

    total_mib: PositiveInt = Field(32768, description="Memory of each simulated GPU in MiB.")
    count: PositiveInt = Field(1, description="Number of simulated GPUs.")
    ledger_dir: Path | None = Field(
        None,
        description=(
            "Where the fake vLLM servers report their memory; null: what the gateway placed."
        ),
    )


class AutoYieldConfig(StrictConfig):
    """Yield by itself when something the gateway does not manage (a game) uses the GPU.

    Foreign memory is what the probe sees used minus what the gateway's backends hold
    (measured, else placed). Above `foreign_mib` for `settle_s`: yield (`include_pinned`
    as for POST /vram/yield). Below it again for `restore_after_s`: restore, but only a
    yield it took itself, never one a person asked for. Off by default."""

    enabled: bool = Field(
        False, description="Yield by itself when something unmanaged (a game) uses the GPU."
    )
    foreign_mib: PositiveInt = Field(
        2048, description="Foreign memory in MiB above which it yields."
    )
    settle_s: NonNegativeFloat = Field(
        10.0, description="Foreign memory must stay above foreign_mib this long before it yields."
    )
    restore_after_s: NonNegativeFloat = Field(
        60.0, description="Foreign memory below foreign_mib this long restores its own yield."
    )
    include_pinned: bool = Field(False, description="The yield stops pinned backends too.")


# One PromQL label matcher: a label name, an operator, a quoted value (PromQL accepts
# double, single and back quotes; prometheus.io, "Querying basics", time series selectors).
_MATCHER = (
    r"""[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
)
SELECTOR_RE: Final = re.compile(rf"\{{\s*(?:{_MATCHER}\s*(?:,\s*{_MATCHER}\s*)*,?\s*)?\}}")


def label_matchers(value: str, *, example: str, metrics: str) -> str:
    """`value` checked as PromQL label matchers in braces (empty: none)."""
    value = value.strip()
    if not value:
        return value
    if SELECTOR_RE.fullmatch(value) is None:
        raise ValueError(
            f"must be PromQL label matchers in braces, like {example} or "
            f'{{instance=~"node-c:.*"}}, got {value!r}'
        )
    if re.search(r"(?:^|[{,\s])__name__\s*[=!]", value):
        raise ValueError(
            f"must not match __name__ (the probe picks {metrics} itself), got {value!r}"
        )
    return value


class PrometheusProbeConfig(StrictConfig):
    """Where `gpu.probe: prometheus` reads another host's GPUs: a Prometheus (or any server
    with its HTTP query API) that scrapes that host's dcgm-exporter.

    - `selector`: PromQL label matchers that pick that host's series, e.g.
      `{Hostname="node-c"}` (dcgm-exporter's `Hostname` label) or `{instance="node-c:9400"}`;
      added to every DCGM metric queried. Empty: every DCGM series Prometheus has.
    - `lookback_s`: how far back a sample is still taken (the query's range). A sample
      older than `gpu.stale_after_s` shows as stale; none within `lookback_s` is a failed
      probe.
    - `query_interval_s`: at most one query this often; samples in between are the last
      answer (Prometheus has nothing newer than its last scrape anyway); 0: a query on
      every sample.
    - `bearer_token_env`: the variable holding a bearer token (never the token itself);
      `headers`: other request headers (e.g. `X-Scope-OrgID` for Mimir or Cortex).
    """

    url: str = Field(description="The Prometheus base URL, like http://prometheus:9090.")
    selector: str = Field(
        "",
        description=(
            'PromQL label matchers picking the host\'s DCGM series, like {Hostname="node-c"}.'
        ),
    )
    timeout_s: PositiveFloat = Field(2.0, description="Timeout of each query.")
    query_interval_s: NonNegativeFloat = Field(
        5.0, description="At most one query this often; 0: a query on every sample."
    )
    lookback_s: PositiveInt = Field(120, description="How far back a sample is still taken.")
    bearer_token_env: str | None = Field(
        None, description="The variable holding a bearer token (never the token)."
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Other request headers (e.g. X-Scope-OrgID); not Authorization.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        http_url(
            value,
            like="the Prometheus base URL like http://prometheus:9090",
            credentials="name the variable holding a token in bearer_token_env",
        )
        return value.rstrip("/")

    @field_validator("selector")
    @classmethod
    def _label_matchers(cls, value: str) -> str:
        return label_matchers(value, example='{Hostname="node-c"}', metrics="the DCGM metrics")

    @field_validator("headers")
    @classmethod
    def _no_authorization(cls, value: dict[str, str]) -> dict[str, str]:
        if any(name.lower() == "authorization" for name in value):
            raise ValueError(
                "must not carry Authorization (a secret in the config file): name the "
                "variable holding the token in bearer_token_env instead"
            )
        return value


class GpuConfig(StrictConfig):
    """The GPU probe behind telemetry, VRAM admission and yield.

    `auto` (the default) is `nvml` when NVML loads and sees a GPU, else `none` with a
    warning (at start, in `/status`, on the page, from `check-config`; `app.gpu.auto`);
    `nvml` reads the real GPUs (nvidia-ml-py) and insists: the probe is reported down
    while NVML fails; `sim` is the simulated GPU (the demo's, the tests'); `prometheus`
    reads another host's GPUs from the dcgm-exporter series in a Prometheus
    (`gpu.prometheus`); `none` turns admission off (every start is allowed) and reports
    no GPU.
    """

    probe: Literal["auto", "nvml", "sim", "prometheus", "none"] = Field(
        "auto",
        description=(
            "auto: nvml when NVML sees a GPU, else none with a warning; nvml: real GPUs; sim: "
            "simulated; prometheus: dcgm-exporter via Prometheus; none: no admission."
        ),
    )
    # Where a backend with `gpus: auto` (or a count) goes at each start (app.vram.choose).
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description=(
            "gpus: auto: pack fills one GPU before the next (whole GPUs stay free for games and "
            "big models); spread puts a start on the GPUs with the most free memory."
        ),
    )
    poll_interval_s: PositiveFloat = Field(1.0, description="How often the GPUs are sampled.")
    sample_timeout_s: PositiveFloat = Field(
        2.0, description="Timeout of one sample of every GPU (NVML can hang)."
    )
    # A snapshot older than this is reported stale in /status and the metrics.
    stale_after_s: PositiveFloat = Field(
        10.0,
        description="A snapshot older than this is reported stale (90 with probe: prometheus).",
    )
    sim: SimGpuConfig = Field(
        default_factory=SimGpuConfig, description="The simulated GPU (probe: sim)."
    )
    reclaim_timeout_s: PositiveFloat = Field(
        10.0,
        description=(
            "After an eviction, wait this long for the memory to show as free (90 with probe: "
            "prometheus)."
        ),
    )
    auto_yield: AutoYieldConfig = Field(
        default_factory=AutoYieldConfig,
        description="Yield when something the gateway does not manage uses the GPU.",
    )
    prometheus: PrometheusProbeConfig | None = Field(
        None, description="Where probe: prometheus reads the GPUs."
    )

    @model_validator(mode="before")
    @classmethod
    def _prometheus_defaults(cls, data: object) -> object:
        # A Prometheus sample is a scrape old (often 15 to 60 s, plus dcgm-exporter's own
        # 30 s collection): NVML's 10 s would call every snapshot stale and refuse every
        # start that waits for evicted memory to show. Explicit values are kept.
        if isinstance(data, dict) and data.get("probe") == "prometheus":
            data = {"stale_after_s": 90.0, "reclaim_timeout_s": 90.0, **data}
        return data

    @model_validator(mode="after")
    def _prometheus_url(self) -> GpuConfig:
        if self.probe == "prometheus" and self.prometheus is None:
            raise ValueError(
                "probe: prometheus needs gpu.prometheus.url (the Prometheus that scrapes the "
                "GPU host's dcgm-exporter), e.g. prometheus: {url: http://prometheus:9090, "
                "selector: '{Hostname=\"node-c\"}'}"
            )
        return self


class SimRamConfig(StrictConfig):
    """A simulated host RAM reading (`host_ram.sim`): what the tests' gateway processes
    read in place of /proc/meminfo, so no test depends on the RAM free on its machine."""

    total_mib: PositiveInt = Field(description="The simulated MemTotal in MiB.")
    available_mib: NonNegativeInt = Field(description="The simulated MemAvailable in MiB.")


class HostRamConfig(StrictConfig):
    """The host RAM that level-1 sleepers may hold on a machine (vLLM sleep level 1 copies
    a backend's weights to *pinned* host memory, which the kernel can neither swap nor
    reclaim: enough level-1 sleepers run the host out of memory).

    - `sleep_budget_mib`: what the weights of the level-1 sleepers together may hold.
      None (default): half of the host's MemTotal. Half, because the rest is needed by
      what else runs there: the OS, the vLLM processes themselves (several GiB each
      awake or asleep), and the page cache that makes level-2 wakes and cold starts read
      the weights from RAM instead of disk. 0: no level-1 sleep on this host.
    - `reserve_mib` (4096): a level-1 sleep must leave at least this much of MemAvailable
      free (MemAvailable measures what else uses the host now, which a budget of
      MemTotal cannot).
    - `selector`: on another host, the PromQL label matchers of its node-exporter's
      series (`node_memory_MemTotal_bytes`, `node_memory_MemAvailable_bytes`), read from
      the Prometheus of its `gpu.prometheus`, e.g. `{instance="node-c:9100"}`. The
      gateway's own machine reads /proc/meminfo.
    - `poll_interval_s`: how often /status and the metrics get a new reading (a release
      decision reads it afresh).
    - `sim`: a simulated reading (tests, demos): the host's RAM is these numbers, never
      /proc/meminfo or node-exporter, so a level-1 decision does not depend on the RAM
      free on the machine running the test.

    Without a reading (another host without a Prometheus probe, or node-exporter down)
    the budget is `sleep_budget_mib` if set, else unknown: then `auto` sleeps at level 2
    and an explicit `method: sleep, level: 1` is kept (app/lifecycle/release.py).
    """

    sleep_budget_mib: NonNegativeInt | None = Field(
        None,
        description=(
            "Host RAM the level-1 sleepers' weights may hold; null: half of MemTotal; 0: no level-1"
            " sleep."
        ),
    )
    reserve_mib: NonNegativeInt = Field(
        4096, description="A level-1 sleep must leave at least this much MemAvailable."
    )
    selector: str = Field(
        "", description="Another host: PromQL label matchers of its node-exporter series."
    )
    poll_interval_s: PositiveFloat = Field(
        5.0, description="How often /status and the metrics get a new reading."
    )

    sim: SimRamConfig | None = Field(
        None,
        description=(
            "A simulated RAM reading (tests, demos) in place of /proc/meminfo or node-exporter;"
            " null: the real one."
        ),
    )

    @field_validator("selector")
    @classmethod
    def _label_matchers(cls, value: str) -> str:
        return label_matchers(
            value, example='{instance="node-c:9100"}', metrics="the node_memory metrics"
        )


# Lowercase only: an environment override (MICROSCHEDULER_HOSTS__NODE_C__...) arrives
# lowercased, and must name the same host as the YAML, not make a second one.
HOST_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class HostConfig(StrictConfig):
    """Another machine whose GPUs the gateway schedules: `hosts: {node-c: {docker: {url},
    gpu: {probe: prometheus, prometheus: {...}}}}`, named by a backend's `host: node-c`.

    - `docker`: the socket proxy of that machine's Docker Engine, for its `runtime: docker`
      backends (none: the host runs only kubernetes or external backends).
    - `gpu`: how the gateway sees that machine's GPUs, as the top-level `gpu:` (probe,
      staleness, reclaim wait, auto yield); required.
    - `host_ram`: its RAM budget for level-1 sleepers (`HostRamConfig`); its RAM is read
      from node-exporter through the Prometheus of `gpu.prometheus`. `nvml` reads the GPUs of the
      gateway's own machine, so it is refused here: use `prometheus` (dcgm-exporter on
      that machine), `sim`, or `none` (admission off on that host).
    """

    docker: DockerConfig | None = Field(
        None, description="That host's Docker socket proxy, for its docker backends; null: none."
    )
    gpu: GpuConfig = Field(description="How the gateway sees that host's GPUs (not nvml).")
    # Its host RAM budget and node-exporter selector; None: the top-level `host_ram:`'s
    # budget and reserve (the selector is per host).
    host_ram: HostRamConfig | None = Field(
        None,
        description=(
            "Its RAM budget for level-1 sleepers; null: the top-level host_ram's budget and "
            "reserve."
        ),
    )

    @field_validator("gpu")
    @classmethod
    def _not_this_machine(cls, gpu: GpuConfig) -> GpuConfig:
        if gpu.probe == "nvml":
            raise ValueError(
                "probe: nvml reads the GPUs of the machine the gateway runs on, not this "
                "host's: use probe: prometheus (dcgm-exporter on that host), sim or none"
            )
        return gpu


def check_hosts(
    hosts: Mapping[str, HostConfig],
    local_gpu: GpuConfig,
    backends: Mapping[str, BackendConfig],
    local_docker: DockerConfig | None = None,
) -> str | None:
    """The first problem with `hosts:` and the backends' `host:`, or None: every host's
    Docker proxy first, then the hosts' names, then each backend's placement."""
    local_url = (local_docker or DockerConfig()).url
    problems = chain(
        (_docker_problem(name, machine.docker, local_url) for name, machine in hosts.items()),
        (_name_problem(name) for name in hosts),
        (_placement_problem(name, cfg, hosts, local_gpu) for name, cfg in backends.items()),
    )
    return next((problem for problem in problems if problem is not None), None)


def _docker_problem(name: str, docker: DockerConfig | None, local_url: str) -> str | None:
    """Host `name`'s `docker:` must name that host's own socket proxy."""
    if docker is None:
        return None
    if "url" not in docker.model_fields_set:
        return (
            f"hosts.{name}.docker.url: required (the default is this machine's own "
            "socket): the URL of that host's Docker socket proxy, e.g. "
            f"http://{name}:2375"
        )
    if docker.url == local_url:
        return (
            f"hosts.{name}.docker.url: {docker.url} is the gateway's own Docker (the "
            "top-level docker.url); give that host's socket proxy"
        )
    return None


def _name_problem(name: str) -> str | None:
    """A host's name: not the gateway's own machine's, and plain (`HOST_NAME_RE`)."""
    if name == LOCAL_HOST:
        return (
            f"hosts.{LOCAL_HOST}: {LOCAL_HOST!r} is the gateway's own machine (the top-level "
            "docker: and gpu:); give the other machine another name"
        )
    if HOST_NAME_RE.fullmatch(name) is None:
        return (
            f"hosts.{name}: a host name is 1 to 64 lowercase letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )
    return None


def _placement_problem(
    backend: str, cfg: BackendConfig, hosts: Mapping[str, HostConfig], local_gpu: GpuConfig
) -> str | None:
    """Backend `backend`'s host must exist, take its runtime and have its GPUs."""
    host = cfg.host_name
    if host == LOCAL_HOST:
        return _gpus_problem(backend, cfg, host, local_gpu)
    if host not in hosts:
        known = ", ".join([LOCAL_HOST, *hosts])
        return f"backends.{backend}.host: no host {host!r} in hosts: (known: {known})"
    machine = hosts[host]
    return _runtime_problem(backend, cfg, host, machine) or _gpus_problem(
        backend, cfg, host, machine.gpu
    )


def _runtime_problem(
    backend: str, cfg: BackendConfig, host: str, machine: HostConfig
) -> str | None:
    """A backend on another host runs there through that host's Docker proxy, Kubernetes
    or as an external server: never as a process of the gateway's machine."""
    if cfg.runtime.kind == "process":
        return (
            f"backends.{backend}.host: {host}: a process runtime runs on the gateway's "
            "own machine; a backend on another host needs runtime docker (through "
            "that host's docker:), kubernetes or external"
        )
    if cfg.runtime.kind == "docker" and machine.docker is None:
        return (
            f"backends.{backend}.runtime: docker on host {host!r}, which has no "
            f"docker: (add hosts.{host}.docker.url, its Docker socket proxy)"
        )
    return None


def _gpus_problem(backend: str, cfg: BackendConfig, host: str, gpu: GpuConfig) -> str | None:
    """On a simulated GPU, a backend's `gpus:` must be among the `gpu.sim.count` there."""
    if gpu.probe != "sim" or not cfg.gpus_accounted:
        return None
    where = "gpu.sim.count" if host == LOCAL_HOST else f"hosts.{host}.gpu.sim.count"
    if cfg.gpu_count > gpu.sim.count:
        return (
            f"backends.{backend}.gpus: {cfg.gpu_count} GPUs at once, but host {host!r} has "
            f"{gpu.sim.count} ({where})"
        )
    missing = [g for g in cfg.fixed_gpus or () if g >= gpu.sim.count]
    if not missing:
        return None
    return (
        f"backends.{backend}.gpus: GPU {missing[0]} does not exist on host "
        f"{host!r} ({where} is {gpu.sim.count})"
    )

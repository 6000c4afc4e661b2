"""The root `Settings` (every top-level key of `models.yaml`, environment over YAML) and its
gateway-wide sections: the HTTP server's limits, timeouts, the Docker proxy, the Kubernetes
API server, the GPU.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from app.settings.backends import BackendConfig, TimeoutsConfig
from app.settings.base import StrictConfig
from app.settings.cloud import CloudConfig, cross_check
from app.settings.keys import KeysConfig, secret_digest
from app.settings.profiles import GpuProfilesConfig

ENV_PREFIX = "MICROSCHEDULER_"


MODELS_FILE = "models.yaml"


CLOUD_FILE = "cloud_providers.yaml"


PROFILES_FILE = "gpu_profiles.yaml"


KEYS_FILE = "keys.yaml"


# Settings fields that only the environment may set.
_ENV_ONLY = frozenset({"config_dir", "api_keys", "admin_key"})


class DockerConfig(StrictConfig):
    """How to reach the Docker Engine API: a socket proxy URL or a Unix socket."""

    url: str = "unix:///var/run/docker.sock"
    timeout_s: PositiveFloat = 10.0  # connect and read, except stop (which waits `t` more)

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
        return value.rstrip("/")


class KubernetesConfig(StrictConfig):
    """How to reach the Kubernetes API server, for `runtime: {kind: kubernetes}` backends.

    `kubeconfig`: a kubeconfig file (its current context); without it `$KUBECONFIG`, then
    the pod's ServiceAccount (in-cluster). `api_url` replaces the server of either, for
    example `http://127.0.0.1:8001` behind `kubectl proxy` (no credentials needed then).
    """

    kubeconfig: Path | None = None
    api_url: str | None = None
    timeout_s: PositiveFloat = 10.0  # connect and read of each call, except watches

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"must be the API server's URL like https://10.0.0.1:6443 or "
                f"http://127.0.0.1:8001 (kubectl proxy), got {value!r}"
            )
        return value.rstrip("/")


class SimGpuConfig(StrictConfig):
    """The simulated GPU of the demo and the tests.

    With `ledger_dir`, its used memory is what the fake vLLM servers report there
    (`--sim-gpu-dir`; a sleeping one reports less), measured like NVML would. Without
    it, used memory is what the gateway placed (the `vram_mib` of running backends plus
    zone holds).
    """

    total_mib: PositiveInt = 32768
    count: PositiveInt = 1
    ledger_dir: Path | None = None


class AutoYieldConfig(StrictConfig):
    """Yield by itself when something the gateway does not manage (a game) uses the GPU.

    Foreign memory is what the probe sees used minus what the gateway's backends hold
    (measured, else placed). Above `foreign_mib` for `settle_s`: yield (`include_pinned`
    as for POST /vram/yield). Below it again for `restore_after_s`: restore, but only a
    yield it took itself, never one a person asked for. Off by default."""

    enabled: bool = False
    foreign_mib: PositiveInt = 2048
    settle_s: NonNegativeFloat = 10.0
    restore_after_s: NonNegativeFloat = 60.0
    include_pinned: bool = False


# One PromQL label matcher: a label name, an operator, a quoted value (PromQL accepts
# double, single and back quotes; prometheus.io, "Querying basics", time series selectors).
_MATCHER = (
    r"""[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
)
SELECTOR_RE: Final = re.compile(rf"\{{\s*(?:{_MATCHER}\s*(?:,\s*{_MATCHER}\s*)*,?\s*)?\}}")


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

    url: str
    selector: str = ""
    timeout_s: PositiveFloat = 2.0
    query_interval_s: NonNegativeFloat = 5.0
    lookback_s: PositiveInt = 120
    bearer_token_env: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"must be the Prometheus base URL like http://prometheus:9090, got {value!r}"
            )
        return value.rstrip("/")

    @field_validator("selector")
    @classmethod
    def _label_matchers(cls, value: str) -> str:
        value = value.strip()
        if not value:
            return value
        if SELECTOR_RE.fullmatch(value) is None:
            raise ValueError(
                "must be PromQL label matchers in braces, like "
                f'{{Hostname="node-c"}} or {{instance=~"node-c:.*"}}, got {value!r}'
            )
        if re.search(r"(?:^|[{,\s])__name__\s*[=!]", value):
            raise ValueError(
                f"must not match __name__ (the probe picks the DCGM metrics itself), got {value!r}"
            )
        return value

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

    `nvml` reads the real GPUs (nvidia-ml-py); `sim` is the simulated GPU; `prometheus`
    reads another host's GPUs from the dcgm-exporter series in a Prometheus
    (`gpu.prometheus`); `none` turns admission off (every start is allowed) and reports
    no GPU.
    """

    probe: Literal["nvml", "sim", "prometheus", "none"] = "sim"
    poll_interval_s: PositiveFloat = 1.0
    sample_timeout_s: PositiveFloat = 2.0  # one sample of every GPU; NVML can hang
    # A snapshot older than this is reported stale in /status and the metrics.
    stale_after_s: PositiveFloat = 10.0
    sim: SimGpuConfig = Field(default_factory=SimGpuConfig)
    reclaim_timeout_s: PositiveFloat = 10.0  # wait for freed memory to show as free
    auto_yield: AutoYieldConfig = Field(default_factory=AutoYieldConfig)
    prometheus: PrometheusProbeConfig | None = None

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


class ServerConfig(StrictConfig):
    """What one client may hold of the gateway's HTTP server, so that slow or abusive
    clients get a 4xx or a closed connection while everyone else is still answered.

    - `max_connections` (1000): open connections at once. When a new one would exceed
      it, the connection idle longest (no request in flight: keep-alive, or headers not
      complete yet) is closed to make room, as nginx reuses keep-alive connections; only
      when every connection has a request in flight is the newcomer answered 503 and
      closed. Uvicorn's own `limit_concurrency` is not used: it counts idle connections
      too and answers the *new request* 503, so a few hundred idle sockets would lock
      every real client out.
    - `header_timeout_s` (10): the request line and headers must arrive within this of
      the connection opening (or the previous response ending); slowloris is closed (408
      when part of a request came). Uvicorn has no such timeout; a real client sends its
      headers in one round trip.
    - `body_timeout_s` (60): the whole body must arrive within this of its first read
      (any route: `BodyGuard`), else 408 `request_timeout` and the connection is closed.
      60 s carries the largest default body (10 MiB) at about 1.4 Mbit/s; raise it for
      big uploads over slow links.
    - `keep_alive_s` (30): an idle keep-alive connection is closed after this. Longer
      than the 5 to 15 s of common clients (httpx, aiohttp), so the client, not the
      server, closes first and no request races a closing socket; idle connections are
      cheap as they are evicted first at `max_connections`.
    - `max_header_bytes` (65536): request line plus headers; more is answered 431 and
      closed (httptools alone has no limit).
    - `backlog` (2048): connections the kernel queues before `accept` (uvicorn's
      default; the kernel caps it at `net.core.somaxconn`).
    """

    max_connections: PositiveInt = 1000
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 60.0
    keep_alive_s: PositiveInt = 30
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    backlog: PositiveInt = 2048


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    config_dir: Path = Path("config")
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    access_log: bool = True
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    admin_key: SecretStr | None = None
    # Accept no client key on a non-loopback address even when chains reach paid providers.
    allow_unauthenticated: bool = False
    max_body_bytes: PositiveInt = 10 * 1024 * 1024
    server: ServerConfig = Field(default_factory=ServerConfig)
    health_interval_s: PositiveFloat = 5.0
    shutdown_grace_s: PositiveFloat = 10.0
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    state_dir: Path = Path("var")  # zone holds survive restarts here
    wake_notice_s: PositiveFloat = 5.0  # a held streaming request gets ": waking ..." this often
    # How long `/v1/responses/{id}` follow-ups find the entry that created the response.
    responses_ttl_s: PositiveFloat = 3600.0
    reaper_interval_s: PositiveFloat = 1.0
    docker: DockerConfig = Field(default_factory=DockerConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    backends: dict[str, BackendConfig] = Field(min_length=1)
    # Read from their own files when present.
    cloud_providers: CloudConfig | None = None
    gpu_profiles: GpuProfilesConfig | None = None
    client_keys: KeysConfig | None = None  # keys.yaml

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",") if key.strip())
        return value

    @field_validator("admin_key", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        owner: dict[str, str] = {}
        for backend, cfg in self.backends.items():
            for kind, names in (("models", cfg.models), ("aliases", cfg.aliases)):
                for name in names:
                    first = owner.get(name)
                    if first is not None and first != backend:
                        group = self.backends[first].replica_of
                        if group is None or cfg.replica_of != group:
                            raise ValueError(
                                f"backends.{backend}.{kind}: {name!r} is already served by "
                                f"backend {first!r}; model ids and aliases must be unique, "
                                "unless the backends are replicas of one group (the same "
                                "`replica_of:` on each)"
                            )
                    else:
                        owner[name] = backend
        self._check_groups()
        if self.gpu_profiles is not None:
            unknown = self.gpu_profiles.unknown_backends(self.backends)
            if unknown:
                raise ValueError(
                    f"{PROFILES_FILE}: {unknown[0]}: no backend of that name in {MODELS_FILE} "
                    f"(backends: {', '.join(self.backends)})"
                )
        if self.gpu.probe == "sim":
            for backend, cfg in self.backends.items():
                missing = [g for g in cfg.gpus if g >= self.gpu.sim.count]
                if missing:
                    raise ValueError(
                        f"backends.{backend}.gpus: GPU {missing[0]} does not exist "
                        f"(gpu.sim.count is {self.gpu.sim.count})"
                    )
        return self

    def _check_groups(self) -> None:
        """The members of a replica group answer alike: the same upstream model id and
        the same APIs, so a request routed to the group may go to any of them."""
        first: dict[str, str] = {}
        for backend, cfg in self.backends.items():
            group = cfg.replica_of
            if group is None:
                continue
            if group in self.backends and group != backend:
                raise ValueError(
                    f"backends.{backend}.replica_of: {group!r} is the name of a backend; "
                    "a replica group needs a name of its own"
                )
            other = first.setdefault(group, backend)
            ref = self.backends[other]
            if cfg.served_model != ref.served_model:
                raise ValueError(
                    f"backends.{backend}.models: replicas of {group!r} must serve the same "
                    f"upstream model id (models[0]): {cfg.served_model!r} here, "
                    f"{ref.served_model!r} on {other!r}"
                )
            if cfg.apis != ref.apis:
                raise ValueError(
                    f"backends.{backend}: replicas of {group!r} must serve the same APIs "
                    f"(runner/endpoints) as {other!r}"
                )

    @model_validator(mode="after")
    def _cloud_names(self) -> Settings:
        if self.cloud_providers is not None:
            problems = cross_check(self.cloud_providers, self.backends)
            if problems:
                raise ValueError(f"{CLOUD_FILE}: {problems[0]}")
        return self

    @model_validator(mode="after")
    def _key_scopes(self) -> Settings:
        """Every model a key names exists, and every key's secret is there."""
        if self.client_keys is None:
            return self
        known = {n for cfg in self.backends.values() for n in (*cfg.models, *cfg.aliases)}
        for name, key in self.client_keys.keys.items():
            for model in key.models or ():
                if model not in known:
                    raise ValueError(
                        f"{KEYS_FILE}: keys.{name}.models: no model or alias {model!r} in "
                        f"{MODELS_FILE} (known: {', '.join(sorted(known))})"
                    )
        unset = self.client_keys.unset_variables(os.environ)
        if unset:
            raise ValueError(f"{KEYS_FILE}: {unset[0]}")
        owners: dict[bytes, str] = {
            secret_digest(key.get_secret_value()): f"MICROSCHEDULER_API_KEYS #{i}"
            for i, key in enumerate(self.api_keys, start=1)
        }
        for name, key in self.client_keys.keys.items():
            digest = key.digest(os.environ)
            if digest in owners:
                # Which key a request used must be unambiguous (limits, scope, metrics).
                raise ValueError(
                    f"{KEYS_FILE}: keys {owners[digest]} and {name} have the same secret"
                )
            owners[digest] = name
        return self

    @property
    def has_client_keys(self) -> bool:
        """Whether `/v1/*` asks for a key (`MICROSCHEDULER_API_KEYS` or keys.yaml)."""
        return bool(self.api_keys) or self.client_keys is not None

    @model_validator(mode="after")
    def _not_open_to_spend(self) -> Settings:
        """Listening beyond this host with no client key while a chain can reach a paid
        provider lets anyone who reaches the port spend the owner's credits: refused,
        unless `allow_unauthenticated` says that is intended."""
        if self.has_client_keys or self.allow_unauthenticated or is_loopback(self.host):
            return self
        paid = sorted(
            {
                entry
                for chain in (self.cloud_providers.chains.values() if self.cloud_providers else ())
                for entry in chain.entries
                if self.cloud_providers is not None
                and entry in self.cloud_providers.providers
                and self.cloud_providers.providers[entry].api_key_env
            }
        )
        if paid:
            raise ValueError(
                f"host: listening on {self.host} without MICROSCHEDULER_API_KEYS, while "
                f"fallback chains can send requests to paid providers ({', '.join(paid)}): "
                "anyone who reaches the port could spend their credits. Set "
                "MICROSCHEDULER_API_KEYS, or MICROSCHEDULER_ALLOW_UNAUTHENTICATED=1 if that "
                "is intended (a trusted network)."
            )
        return self

    def backend_timeouts(self, name: str) -> TimeoutsConfig:
        return self.backends[name].timeouts.apply(self.timeouts)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML arrives as init kwargs; the environment must win over it.
        return (env_settings, init_settings)


def is_loopback(host: str | None) -> bool:
    """A loopback address (or `localhost`): only this machine can connect."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

"""The root `Settings` (every top-level key of `models.yaml`, environment over YAML) and its
gateway-wide sections: the HTTP server's limits and timeouts (where backends run, the
Docker proxy, the GPU and other hosts, is `app.settings.hosts`).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Final, Literal
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
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.settings.backends import BackendConfig
from app.settings.base import LOCAL_HOST, StrictConfig
from app.settings.cloud import CloudConfig, cross_check
from app.settings.hosts import (
    DockerConfig,
    GpuConfig,
    HostConfig,
    HostRamConfig,
    KubernetesConfig,
    check_hosts,
)
from app.settings.keys import KeysConfig, secret_digest
from app.settings.notify import NotifyTarget
from app.settings.origins import hosts, origin, split_list
from app.settings.profiles import GpuProfilesConfig
from app.settings.schedules import ScheduleWindow, check_schedules, check_timezone
from app.settings.store import StoreConfig
from app.settings.timeouts import TimeoutsConfig
from app.settings.urls import shared_server

ENV_PREFIX = "MICROSCHEDULER_"


MODELS_FILE = "models.yaml"


CLOUD_FILE = "cloud_providers.yaml"


PROFILES_FILE = "gpu_profiles.yaml"


KEYS_FILE = "keys.yaml"

# The config directory when neither --config nor MICROSCHEDULER_CONFIG_DIR names one.
DEFAULT_CONFIG_DIR: Final = Path("config")
# Where state is kept when `state_dir` is not set (relative to the working directory).
STATE_ROOT: Final = Path("var")


def default_state_dir(config_dir: Path | str) -> Path:
    """The state directory of a configuration that sets no `state_dir`: `var` for the
    default config directory (`config/` of the working directory, where every
    configuration kept its state before), else `var/<name of the config directory>`
    (`--config config/demo`: `var/demo`), so the zones, usage and process records saved
    under one configuration never show up under another. Two config directories of the
    same name share it: set `state_dir` (MICROSCHEDULER_STATE_DIR) for one of them."""
    resolved = Path(config_dir).resolve()
    if resolved == DEFAULT_CONFIG_DIR.resolve() or not resolved.name:
        return STATE_ROOT
    return STATE_ROOT / resolved.name


# Settings fields that only the environment may set.
_ENV_ONLY = frozenset({"config_dir", "api_keys", "admin_key"})

# The keyword argument of `Settings(...)` holding the command line's values (`serve
# --host`): they win over the environment, which wins over the YAML (the other keyword
# arguments). One construction, so every validator sees the values that will be used.
FLAGS = "<command line>"


class ServerConfig(StrictConfig):
    """What one client may hold of the gateway's HTTP server, so that slow or abusive
    clients get a 4xx or a closed connection while everyone else is still answered.

    - `max_connections` (default: sized from the file limit): client connections at once.
      `serve` raises its soft file limit (RLIMIT_NOFILE) to the hard one and takes what
      that holds at two files a stream (the client's socket and the upstream's) after
      1,024 kept for the gateway's own (`app.api.capacity`): 9,488 connections at a limit
      of 20,000. It says the cap at start and in `/status`, and warns (at start and in
      `check-config`) when the limit allows fewer than 4,096, or a configured cap more
      than the limit holds. When a new connection would exceed it, one is closed to make
      room: first the one whose request head began longest ago and is still incomplete (a
      slowloris client dribbling headers), else the one idle longest (kept alive, or
      opened and silent), as nginx reuses keep-alive connections. Only when every
      connection has a request in flight does the newcomer wait in one of a few reserve
      slots (`app.api.connections.RESERVE`, 8) for its request line, at most 2 s:
      `GET /health` and `GET /ready` are served there (a liveness probe must not restart a
      busy gateway); any other request is queued (256 at most, first come first served)
      and let in when a connection closes or goes idle. While the queue is full the
      gateway stops accepting: newcomers wait, connected, in the kernel's backlog
      (`backlog`), as behind HAProxy's `maxconn`. A burst waits; it is not cut.
      A refusal (a request queued longer than `queue_timeout_s`, a socket silent in a
      reserve slot) is a 503 with `Retry-After`, written, the connection half-closed and
      the client's unread request drained for up to 2 s, so the client reads the 503
      instead of a TCP reset. Uvicorn's own `limit_concurrency` is not used: it counts
      idle connections too and answers the *new request* 503, so a few hundred idle
      sockets would lock every real client out.
    - `queue_timeout_s` (60): how long a request over the cap waits for a connection
      before its 503 (HAProxy's `timeout queue`).
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
      cheap as they are evicted at `max_connections` (after incomplete heads).
    - `max_header_bytes` (65536): request line plus headers, and apart from them a
      chunked body's trailer fields; more is answered 431 and closed (httptools alone has
      no limit, and buffers a trailer field whole).
    - `backlog` (65535): connections the kernel queues before `accept`: as many as it
      allows, since it caps the number at `net.core.somaxconn` (4,096 by default; Go's
      servers ask for that much too). uvicorn's default, 2,048, dropped the SYNs of a
      9,000-stream burst (13,142 listen overflows, clients resending after 1, 3, 7, 15 s).
    """

    max_connections: PositiveInt | None = Field(
        None,
        description=(
            "Client connections at once (default: what the file limit holds, two files a "
            "stream); beyond it an incomplete or idle one is closed to make room, else the "
            "request waits."
        ),
    )
    queue_timeout_s: PositiveFloat = Field(
        60.0, description="A request over the connection cap waits this long, then 503."
    )
    header_timeout_s: PositiveFloat = Field(
        10.0, description="The request line and headers must arrive within this (408)."
    )
    body_timeout_s: PositiveFloat = Field(
        60.0, description="The whole body must arrive within this of its first read (408)."
    )
    keep_alive_s: PositiveInt = Field(
        30, description="An idle keep-alive connection is closed after this."
    )
    max_header_bytes: Annotated[int, Field(ge=1024)] = Field(
        64 * 1024,
        description="Request line plus headers (and a chunked body's trailer); more is 431.",
    )
    backlog: PositiveInt = Field(
        65535,
        description="Connections the kernel queues before accept (it caps this at somaxconn).",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    config_dir: Path = DEFAULT_CONFIG_DIR
    host: str = Field("127.0.0.1", description="The address the gateway listens on.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(8080, description="The port it listens on.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="DEBUG, INFO, WARNING or ERROR."
    )
    access_log: bool = Field(True, description="Log one line per request.")
    # How many of the last requests `GET /activity` keeps (in memory, oldest dropped).
    activity_size: PositiveInt = Field(
        1000, description="How many of the last requests GET /activity keeps in memory."
    )
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    admin_key: SecretStr | None = None
    # Accept no client key on a non-loopback address even when chains reach paid providers.
    allow_unauthenticated: bool = Field(
        False,
        description="Accept no client key beyond loopback even when chains reach paid providers.",
    )
    # Browser pages of other sites that may call the gateway (and get CORS headers);
    # every other origin is refused on admin routes, and on model routes without client
    # keys (`app.access.origins`).
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "Browser origins that may call the gateway (CORS), like https://chat.example.com."
        ),
    )
    # `Host` names admin routes accept besides loopback, `host` and the allowed origins'
    # hosts (a reverse proxy's public name); `*` turns the check off.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "Host names admin routes accept besides loopback and host; * turns the check off."
        ),
    )
    # `/metrics` open to anyone even when it would be an admin route (`metrics_admin_only`).
    metrics_public: bool = Field(
        False, description="/metrics open to anyone even beyond loopback (else an admin route)."
    )
    max_body_bytes: PositiveInt = Field(
        10 * 1024 * 1024, description="The largest request body; more is 413."
    )
    server: ServerConfig = Field(
        default_factory=ServerConfig, description="What one client may hold of the HTTP server."
    )
    # An idle backend's /health (and its /metrics, polled every gpu.poll_interval_s) less
    # often: up to every 30 s (app/control/polling.py).
    health_interval_s: PositiveFloat = Field(
        5.0, description="How often backends in use are health-checked (idle ones less often)."
    )
    shutdown_grace_s: PositiveFloat = Field(
        10.0, description="At shutdown, requests in flight get this long to finish."
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    # Zone holds, usage and budgets survive restarts here; unset: `default_state_dir`.
    state_dir: Path = STATE_ROOT
    store: StoreConfig = Field(default_factory=StoreConfig)  # app.settings.store
    wake_notice_s: PositiveFloat = Field(
        5.0, description="A held streaming request gets an SSE comment (': waking ...') this often."
    )
    # No load nobody waits for (docs/lifecycle.md): a lazy start whose held requests all
    # left goes on this long before it is cancelled, so a client retrying at once finds it.
    start_cancel_grace_s: NonNegativeFloat = Field(
        2.0,
        description="A lazy start nobody waits for any more is cancelled after this long.",
    )
    # How long `/v1/responses/{id}` follow-ups find the entry that created the response.
    responses_ttl_s: PositiveFloat = Field(
        3600.0, description="How long /v1/responses/{id} follow-ups find the entry that created it."
    )
    # How many such ids are remembered at once, and how many of them one client key may
    # hold (a key over its share loses its own oldest, never another key's).
    responses_max_ids: PositiveInt = Field(10_000, description="Response ids remembered at once.")
    responses_max_ids_per_key: PositiveInt = Field(
        1_000, description="Response ids one client key may hold (it loses its own oldest)."
    )
    reaper_interval_s: PositiveFloat = Field(
        1.0, description="How often idle backends, expired zones and yields are checked."
    )
    docker: DockerConfig = Field(
        default_factory=DockerConfig, description="The Docker Engine of the gateway's machine."
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig,
        description="The Kubernetes API server, for kubernetes backends.",
    )
    gpu: GpuConfig = Field(
        default_factory=GpuConfig, description="The GPU probe of the gateway's machine."
    )
    # The host RAM level-1 sleepers may hold on the gateway's machine, and by default on
    # every host (`hosts.NAME.host_ram` overrides it there).
    host_ram: HostRamConfig = Field(
        default_factory=HostRamConfig,
        description="The host RAM level-1 sleepers may hold (every host's default).",
    )
    # Other machines: each with its Docker proxy and GPU probe (`app.settings.hosts`).
    hosts: dict[str, HostConfig] = Field(
        default_factory=dict,
        description="Other machines whose GPUs the gateway schedules, by name.",
    )
    backends: dict[str, BackendConfig] = Field(
        min_length=1, description="The local models' servers, by name."
    )
    # Read from their own files when present.
    cloud_providers: CloudConfig | None = None
    gpu_profiles: GpuProfilesConfig | None = None
    client_keys: KeysConfig | None = None  # keys.yaml
    # Where events are posted (webhooks, ntfy; `app.settings.notify`).
    notify: tuple[NotifyTarget, ...] = Field(
        (), description="Where events are posted (webhooks, ntfy)."
    )
    # Weekly windows (app.settings.schedules), in `timezone` (None: the system's zone).
    timezone: str | None = Field(
        None, description="The zone of schedules (an IANA name); null: the system's."
    )
    schedules: list[ScheduleWindow] = Field(
        default_factory=list,
        description="Weekly windows: a yield, a GPU profile or a kept-warm backend.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_state_dir(cls, data: Any) -> Any:
        """`state_dir` from its config directory when no source (flag, environment, YAML)
        sets it: every source's values arrive here together."""
        if isinstance(data, dict) and data.get("state_dir") is None:
            config_dir = data.get("config_dir") or DEFAULT_CONFIG_DIR
            return {**data, "state_dir": default_state_dir(config_dir)}
        return data

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str | None) -> str | None:
        return check_timezone(value)

    @model_validator(mode="after")
    def _schedules(self) -> Settings:
        profiles = None if self.gpu_profiles is None else self.gpu_profiles.profiles
        problem = check_schedules(self.schedules, self.backends, profiles)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",") if key.strip())
        return value

    @field_validator("allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        return split_list(value)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(origin(item) for item in value)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return hosts(value)

    @field_validator("admin_key", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        owner: dict[str, str] = {}
        for backend, cfg in self.backends.items():
            for kind, names in (
                ("models", cfg.models),
                ("aliases", cfg.aliases),
                ("adapters", list(cfg.adapters)),
            ):
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
        shared = shared_server(self.backends)
        if shared is not None:
            raise ValueError(shared)
        if self.gpu_profiles is not None:
            unknown = self.gpu_profiles.unknown_backends(self.backends)
            if unknown:
                raise ValueError(
                    f"{PROFILES_FILE}: {unknown[0]}: no backend of that name in {MODELS_FILE} "
                    f"(backends: {', '.join(self.backends)})"
                )
        problem = check_hosts(self.hosts, self.gpu, self.backends, self.docker)
        if problem is not None:
            raise ValueError(problem)
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
            if cfg.adapters != ref.adapters:
                raise ValueError(
                    f"backends.{backend}.adapters: replicas of {group!r} must serve the same "
                    f"LoRA adapters (names and paths) as {other!r}"
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
        known = {n for cfg in self.backends.values() for n in cfg.names}  # adapters too
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

    @property
    def metrics_admin_only(self) -> bool:
        """Whether `/metrics` (every client key's name and usage) is an admin route (the
        admin key when one is set, else loopback clients only): when the gateway listens
        beyond loopback, unless `metrics_public`."""
        return not is_loopback(self.host) and not self.metrics_public

    @model_validator(mode="after")
    def _notify_not_self(self) -> Settings:
        """A notify target that is this gateway (a loopback name, or its listen host, on
        its port) would post to itself: an admin route there (`/config/reload`) notifies
        again, in a loop. Refused here; one it reaches by another name is refused when the
        post arrives (`app.notify.notifier.LOOP_HEADER`)."""
        for index, target in enumerate(self.notify):
            parts = urlsplit(target.resolved_url())
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                continue  # the target's own check says why
            host = parts.hostname or ""
            if port == self.port and (
                is_loopback(host) or host == self.host or host in ("0.0.0.0", "::")
            ):
                raise ValueError(
                    f"notify: target {index} posts to this gateway itself ({host}:{port}): "
                    "each post would act on the gateway and notify again, in a loop"
                )
        return self

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
                f"MICROSCHEDULER_API_KEYS (or keys in {KEYS_FILE}), or "
                "MICROSCHEDULER_ALLOW_UNAUTHENTICATED=1 if that is intended (a trusted "
                "network)."
            )
        return self

    def host_ram_of(self, host: str) -> HostRamConfig:
        """The host RAM settings of `host` (`local`: the top-level `host_ram:`). Another
        host without its own takes the top-level budget and reserve, not its selector."""
        if host == LOCAL_HOST or host not in self.hosts:
            return self.host_ram
        own = self.hosts[host].host_ram
        return own if own is not None else self.host_ram.model_copy(update={"selector": ""})

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
        # The YAML arrives as init kwargs, the command line's values under `FLAGS`:
        # flags over the environment over the YAML.
        assert isinstance(init_settings, InitSettingsSource)
        files = dict(init_settings.init_kwargs)
        flags = files.pop(FLAGS, None) or {}
        return (
            InitSettingsSource(settings_cls, flags),
            env_settings,
            InitSettingsSource(settings_cls, files),
        )


def is_loopback(host: str | None) -> bool:
    """A loopback address (or `localhost`): only this machine can connect."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

"""Configuration: environment (`MICROSCHEDULER_*`, `__` for nesting) over YAML files.

The config directory (`--config DIR`, `MICROSCHEDULER_CONFIG_DIR`, default `config/`) holds
`models.yaml` (required) and, when present, `cloud_providers.yaml` and `gpu_profiles.yaml`.
Every top-level key of `models.yaml` is a `Settings` field; an environment variable wins
over the YAML value of the same key (`MICROSCHEDULER_TIMEOUTS__CONNECT_S=2`). Secrets
(`api_keys`, `admin_key`) come from the environment only.

`load_settings()` fails fast with a `ConfigError` whose lines each name the file (or the
environment variable), the key and the problem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from app.planner.description import HfConfigField, ModelInfoConfig, paths_relative_to, resolve
from app.settings.cloud import CloudConfig, cross_check
from app.settings.profiles import GpuProfilesConfig

ENV_PREFIX = "MICROSCHEDULER_"
MODELS_FILE = "models.yaml"
CLOUD_FILE = "cloud_providers.yaml"
PROFILES_FILE = "gpu_profiles.yaml"
# Settings fields that only the environment may set.
_ENV_ONLY = frozenset({"config_dir", "api_keys", "admin_key"})
# Settings fields filled from the optional files, never from models.yaml.
_FROM_OTHER_FILES = {"cloud_providers": CLOUD_FILE, "gpu_profiles": PROFILES_FILE}


class ConfigError(Exception):
    """Invalid configuration; `problems` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TimeoutsConfig(_Strict):
    """Network waits of the data plane. Streams never get a total timeout.

    `first_byte_s` bounds the wait for the response headers and the first body chunk;
    for a non-streaming request that is the whole generation, hence the long default.
    """

    connect_s: PositiveFloat = 5.0
    first_byte_s: PositiveFloat = 300.0
    idle_s: PositiveFloat = 60.0


class TimeoutOverridesConfig(_Strict):
    connect_s: PositiveFloat | None = None
    first_byte_s: PositiveFloat | None = None
    idle_s: PositiveFloat | None = None

    def apply(self, base: TimeoutsConfig) -> TimeoutsConfig:
        return base.model_copy(update=self.model_dump(exclude_none=True))


class ExternalRuntimeConfig(_Strict):
    """A server we do not manage: health-checked only."""

    kind: Literal["external"] = "external"


class ProcessRuntimeConfig(_Strict):
    """A command started by the gateway and stopped (whole process group) by it."""

    kind: Literal["process"]
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None
    stop_grace_s: PositiveFloat = 10.0


class DockerRuntimeConfig(_Strict):
    """An existing container, started and stopped through the Docker Engine API.

    `stop_timeout_s` is Docker's `t`: how long the container gets after SIGTERM before
    the engine kills it (vLLM needs a few seconds to free the GPU cleanly).
    """

    kind: Literal["docker"]
    container: str = Field(min_length=1)
    # Bounded: socket proxies cut requests after 10 minutes, and a stop call lasts `t`.
    stop_timeout_s: Annotated[int, Field(ge=0, le=300)] = 30


RuntimeConfig = Annotated[
    ExternalRuntimeConfig | ProcessRuntimeConfig | DockerRuntimeConfig, Field(discriminator="kind")
]


class DockerConfig(_Strict):
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


class SimGpuConfig(_Strict):
    """The simulated GPU of the demo and the tests.

    With `ledger_dir`, its used memory is what the fake vLLM servers report there
    (`--sim-gpu-dir`; a sleeping one reports less), measured like NVML would. Without
    it, used memory is what the gateway placed (the `vram_mib` of running backends plus
    zone holds).
    """

    total_mib: PositiveInt = 32768
    count: PositiveInt = 1
    ledger_dir: Path | None = None


class GpuConfig(_Strict):
    """The GPU probe behind telemetry, VRAM admission and yield.

    `nvml` reads the real GPUs (nvidia-ml-py); `sim` is the simulated GPU; `none` turns
    admission off (every start is allowed) and reports no GPU.
    """

    probe: Literal["nvml", "sim", "none"] = "sim"
    poll_interval_s: PositiveFloat = 1.0
    sample_timeout_s: PositiveFloat = 2.0  # one sample of every GPU; NVML can hang
    # A snapshot older than this is reported stale in /status and the metrics.
    stale_after_s: PositiveFloat = 10.0
    sim: SimGpuConfig = Field(default_factory=SimGpuConfig)
    reclaim_timeout_s: PositiveFloat = 10.0  # wait for freed memory to show as free


class YieldConfig(_Strict):
    """How a backend gives its VRAM back for a yield (`POST /vram/yield`).

    `sleep` uses vLLM's sleep mode (`POST /sleep?level=N`; the server needs
    `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`), which keeps the process and
    wakes in seconds; when the server does not offer it, the backend is stopped instead.
    """

    method: Literal["stop", "sleep"] = "stop"
    level: Literal[1, 2] = 1


class BackendConfig(_Strict):
    url: str
    models: list[str] = Field(min_length=1)
    aliases: list[str] = Field(default_factory=list)
    role: str | None = None
    runtime: RuntimeConfig = Field(default_factory=ExternalRuntimeConfig)
    timeouts: TimeoutOverridesConfig = Field(default_factory=TimeoutOverridesConfig)
    health_path: str = "/health"
    api_key_env: str | None = None
    max_connections: PositiveInt = 512
    # Lifecycle (see README "Model lifecycle").
    lifecycle: Literal["pinned", "lazy"] = "pinned"
    idle_ttl_s: NonNegativeFloat = 0.0
    priority: int = 50
    vram_mib: PositiveInt | None = None
    gpus: list[NonNegativeInt] = Field(default_factory=lambda: [0], min_length=1)
    start_timeout_s: PositiveFloat = 300.0
    max_waiting: NonNegativeInt = 64
    max_wait_s: PositiveFloat = 120.0
    drain_timeout_s: NonNegativeFloat = 60.0
    yield_: YieldConfig = Field(default_factory=YieldConfig, alias="yield")
    # What the model is and how it is served, for the planner (app/planner/description.py):
    # the admission footprint without vram_mib, and `microscheduler plan profile`.
    model_info: ModelInfoConfig | None = None
    hf_config: HfConfigField = None  # read once at load, relative to the config directory

    @field_validator("url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) base URL like http://host:8000, got {value!r}")
        if parts.query or parts.fragment:
            raise ValueError("must not carry a query or fragment")
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

    @model_validator(mode="after")
    def _lifecycle(self) -> BackendConfig:
        if self.lifecycle == "lazy":
            if self.runtime.kind == "external":
                raise ValueError(
                    "lifecycle: lazy needs a runtime the gateway can start (docker or process), "
                    "not external"
                )
            if self.vram_mib is None and self.model_info is None and self.hf_config is None:
                raise ValueError(
                    "vram_mib: is required for lifecycle: lazy (used for admission), unless "
                    "model_info: or hf_config: describes the model to plan it from"
                )
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"gpus: lists a GPU twice: {self.gpus}")
        resolve(self.model_info, self.hf_config)  # a description must be usable
        return self

    @property
    def managed(self) -> bool:
        return self.runtime.kind != "external"

    @property
    def served_model(self) -> str:
        """The id sent upstream, whatever name the client used."""
        return self.models[0]


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
    max_body_bytes: PositiveInt = 10 * 1024 * 1024
    health_interval_s: PositiveFloat = 5.0
    shutdown_grace_s: PositiveFloat = 10.0
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    state_dir: Path = Path("var")  # zone holds survive restarts here
    wake_notice_s: PositiveFloat = 5.0  # a held streaming request gets ": waking ..." this often
    reaper_interval_s: PositiveFloat = 1.0
    docker: DockerConfig = Field(default_factory=DockerConfig)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    backends: dict[str, BackendConfig] = Field(min_length=1)
    # Read from their own files when present.
    cloud_providers: CloudConfig | None = None
    gpu_profiles: GpuProfilesConfig | None = None

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
                    if name in owner and owner[name] != backend:
                        raise ValueError(
                            f"backends.{backend}.{kind}: {name!r} is already served by backend "
                            f"{owner[name]!r}; model ids and aliases must be unique"
                        )
                    owner[name] = backend
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

    @model_validator(mode="after")
    def _cloud_names(self) -> Settings:
        if self.cloud_providers is not None:
            problems = cross_check(self.cloud_providers, self.backends)
            if problems:
                raise ValueError(f"{CLOUD_FILE}: {problems[0]}")
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


def load_settings(config_dir: Path | str | None = None, **overrides: Any) -> Settings:
    """Read the config directory and the environment; raise `ConfigError` on any problem.

    `overrides` (from CLI flags) win over everything.
    """
    environ = os.environ
    directory = Path(
        config_dir if config_dir is not None else environ.get(f"{ENV_PREFIX}CONFIG_DIR", "config")
    )
    if not directory.is_dir():
        raise ConfigError([f"{directory}: config directory does not exist"])

    models_path = directory / MODELS_FILE
    if not models_path.is_file():
        raise ConfigError([f"{models_path}: file not found (every config directory needs one)"])
    data = _read_yaml(models_path)
    problems = [
        f"{models_path}: {key}: may only be set through the environment ({ENV_PREFIX}{key.upper()})"
        for key in sorted(_ENV_ONLY & data.keys())
    ] + [
        f"{models_path}: {key}: belongs in {fname} in the same directory"
        for key, fname in _FROM_OTHER_FILES.items()
        if key in data
    ]
    if problems:
        raise ConfigError(problems)
    for key, fname in _FROM_OTHER_FILES.items():
        path = directory / fname
        if path.is_file():
            data[key] = _read_yaml(path)

    try:
        with paths_relative_to(directory):
            settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, directory, environ)) from None
    # Plain values the caller already validated (CLI flags), applied last so they win.
    return settings.model_copy(update={"config_dir": directory, **overrides})


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}: {where}invalid YAML: {problem}"]) from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            [f"{path}: the top level must be a mapping of keys, not a {type(loaded).__name__}"]
        )
    return loaded


def _describe(exc: ValidationError, directory: Path, environ: Mapping[str, str]) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        message = err["msg"].removeprefix("Value error, ")
        top = loc[0] if loc else ""
        env_name = ENV_PREFIX + "__".join(loc).upper()
        if top in _FROM_OTHER_FILES:
            source = str(directory / _FROM_OTHER_FILES[top])
            loc = loc[1:]
        elif any(
            env_name == name.upper() or env_name.startswith(name.upper() + "__") for name in environ
        ):
            source = f"environment {env_name}"
        elif top in _ENV_ONLY:
            source = f"environment {ENV_PREFIX}{top.upper()}"
        else:
            source = str(directory / MODELS_FILE)
        key = ".".join(loc)
        for fname in _FROM_OTHER_FILES.values():
            if not loc and message.startswith(f"{fname}: "):
                # A cross-file check (names in one file that another must define).
                source, message = str(directory / fname), message.removeprefix(f"{fname}: ")
        if err["type"] == "missing":
            message = "is required"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (check the spelling against the README)"
        lines.append(f"{source}: {key}: {message}" if key else f"{source}: {message}")
    return lines

"""Configuration: environment (`MICROSCHEDULER_*`, `__` for nesting) over YAML files.

The config directory (`--config DIR`, `MICROSCHEDULER_CONFIG_DIR`, default `config/`) holds
`models.yaml` (required) and, when present, `cloud_providers.yaml` and `gpu_profiles.yaml`.
Every top-level key of `models.yaml` is a `Settings` field; an environment variable wins
over the YAML value of the same key (`MICROSCHEDULER_TIMEOUTS__CONNECT_S=2`). Secrets
(`api_keys`, `admin_key`) come from the environment only. Command-line flags (`serve
--host`) win over both; the three are validated together, so every check holds whichever
source a value comes from.

`load_settings()` fails fast with a `ConfigError` whose lines each name the file (or the
environment variable), the key and the problem.

The schema is split by concern: `backends` (one backend), `root` (`Settings` and the
gateway-wide sections), `hosts` (the Docker proxy, the GPU, other machines), `cloud`
(`cloud_providers.yaml`), `profiles` (`gpu_profiles.yaml`), `model_info` and `hf_config`
(a backend's model description), `loader` (`load_settings`).
This package re-exports the names callers use.
"""

from app.settings.backends import BackendConfig, ReleaseConfig
from app.settings.base import LOCAL_HOST
from app.settings.hosts import (
    AutoYieldConfig,
    DockerConfig,
    GpuConfig,
    HostConfig,
    HostRamConfig,
    KubernetesConfig,
    PrometheusProbeConfig,
    SimGpuConfig,
    SimRamConfig,
)
from app.settings.loader import ConfigError, load_settings
from app.settings.root import (
    CLOUD_FILE,
    ENV_PREFIX,
    MODELS_FILE,
    PROFILES_FILE,
    Settings,
    default_state_dir,
)
from app.settings.runtimes import (
    DockerRuntimeConfig,
    ExternalRuntimeConfig,
    KubernetesRuntimeConfig,
    ProcessRuntimeConfig,
)
from app.settings.timeouts import TimeoutOverridesConfig, TimeoutsConfig

__all__ = [
    "CLOUD_FILE",
    "ENV_PREFIX",
    "LOCAL_HOST",
    "MODELS_FILE",
    "PROFILES_FILE",
    "AutoYieldConfig",
    "BackendConfig",
    "ConfigError",
    "DockerConfig",
    "DockerRuntimeConfig",
    "ExternalRuntimeConfig",
    "GpuConfig",
    "HostConfig",
    "HostRamConfig",
    "KubernetesConfig",
    "KubernetesRuntimeConfig",
    "ProcessRuntimeConfig",
    "PrometheusProbeConfig",
    "ReleaseConfig",
    "Settings",
    "SimGpuConfig",
    "SimRamConfig",
    "TimeoutOverridesConfig",
    "TimeoutsConfig",
    "default_state_dir",
    "load_settings",
]

"""The environment a process backend starts with: the gateway's, minus its secrets.

A model server loaded with `--trust-remote-code` runs code from the model's repository and
can read its own environment (`/proc/PID/environ`). It gets the gateway's environment
(PATH, HOME, CUDA and HF variables...) without:

- every variable the configuration names as holding a secret: any `*_env` setting
  (`api_key_env` of backends and cloud providers, `key_env` of client keys,
  `bearer_token_env` of Prometheus hosts, and any such setting added later), except the
  backend's own `api_key_env`, the key its server checks (vLLM reads `VLLM_API_KEY`);
- every `MICROSCHEDULER_*` variable (the admin key, the client keys, the gateway's own
  settings: none of them is the server's business);

then the backend's own `runtime.env` on top (which may set any of them again, on purpose).
Pure: the settings and the environment are passed in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from app.settings import ProcessRuntimeConfig, Settings
from app.settings.root import ENV_PREFIX

SECRET_SUFFIX = "_env"


def child_environment(
    settings: Settings, backend: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """`environ` minus the secrets `settings` names, plus `backends.<backend>.runtime.env`."""
    config = settings.backends[backend]
    keep = {config.api_key_env} if config.api_key_env else set()
    secrets = secret_variables(settings) - keep
    env = {
        name: value
        for name, value in environ.items()
        if name not in secrets and not name.upper().startswith(ENV_PREFIX)
    }
    if isinstance(config.runtime, ProcessRuntimeConfig):
        env.update(config.runtime.env)
    return env


def secret_variables(settings: Settings) -> set[str]:
    """The names of every variable a `*_env` setting refers to, anywhere in `settings`."""
    return set(_env_references(settings))


def _env_references(value: Any) -> Iterator[str]:
    if isinstance(value, BaseModel):
        for field in type(value).model_fields:
            item = getattr(value, field)
            if field.endswith(SECRET_SUFFIX) and isinstance(item, str) and item:
                yield item
            else:
                yield from _env_references(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _env_references(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _env_references(item)

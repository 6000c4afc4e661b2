"""`keys.yaml`: the client keys, what each may use and how much (docs/keys.md).

    keys:
      agents:                       # the name: metrics, logs, /status; never the secret
        key_env: AGENTS_KEY         # the secret, from this environment variable
        models: [orchestrator]      # ids or aliases it may use (default: all)
        cloud: false                # may its requests fall back to cloud providers
        lifecycle: true             # may load and unload its models (default false)
        priority: high              # high | normal | low
        weight: 1                   # its share of turns against keys of its priority
        rpm: 600                    # requests per minute
        tpm: 200000                 # tokens per minute, counted from usage
        max_concurrent: 8           # requests in flight
        daily_cloud_tokens: 0       # tokens served by cloud providers per UTC day
        fallback_on: [queue_full]   # opt-in triggers for its requests, as a chain's
        max_wait_s: 5               # the wait it accepts for a cold chain entry

A key's secret is never in the file itself: `key_env` names the variable that holds it, or
`key_sha256` holds the SHA-256 of it (hex), so the file can be shared or committed.
`MICROSCHEDULER_API_KEYS` keeps working beside it: each of those is a key with no limits.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from app.settings.base import StrictConfig
from app.settings.cloud import FallbackTrigger


class Priority(StrEnum):
    """A key's priority: the order of its requests in a backend's queue, and vLLM's request
    `priority` on backends with `scheduling: priority` (vLLM runs lower values first)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """Queue order: lower is served first."""
        return _RANK[self]

    @property
    def vllm(self) -> int:
        """vLLM's `priority` field (`--scheduling-policy priority`: lower runs first)."""
        return _RANK[self] - 1


_RANK: Final = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
MAX_WEIGHT: Final = 1000  # a key's `weight`: 1 to this
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
# Names go into metric labels and logs: keep them short and plain.
KeyName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class KeyConfig(StrictConfig):
    key_env: str | None = Field(
        default=None,
        min_length=1,
        description="The variable holding the key's secret (one of key_env and key_sha256).",
    )
    key_sha256: str | None = Field(
        None, description="The SHA-256 of the secret in hex (one of key_env and key_sha256)."
    )
    models: list[str] | None = Field(
        default=None, min_length=1, description="Model ids or aliases it may use; null: all."
    )
    cloud: bool = Field(True, description="Whether its requests may fall back to cloud providers.")
    lifecycle: bool = Field(
        False,
        description=(
            "Whether it may load and unload the models in its scope (POST /models/load and "
            "/models/unload, Ollama's keep_alive): an unload frees VRAM another client may be "
            "using, so it is off unless said."
        ),
    )
    priority: Priority = Field(
        Priority.NORMAL,
        description="high, normal or low: the order of its requests in a backend's queue.",
    )
    # Within a priority, keys take turns in a backend's queue, `weight` turns each for a key
    # against 1 of a key of weight 1 (app.lifecycle.key_turns).
    weight: Annotated[int, Field(ge=1, le=MAX_WEIGHT)] = Field(
        1,
        description="Its share of a backend's turns against keys of its priority (1 to 1000).",
    )
    rpm: PositiveInt | None = Field(None, description="Requests per minute; null: no limit.")
    tpm: PositiveInt | None = Field(
        None, description="Tokens per minute, counted from usage; null: no limit."
    )
    max_concurrent: PositiveInt | None = Field(
        None, description="Requests in flight at once; null: no limit."
    )
    daily_cloud_tokens: NonNegativeInt | None = Field(
        None, description="Tokens served by cloud providers per UTC day; null: no limit."
    )
    # Its requests move on past a busy local chain entry even when the chain does not say
    # so (`fallback_on` of `cloud_providers.yaml`): for a key that would rather pay than wait.
    fallback_on: list[FallbackTrigger] = Field(
        default_factory=list,
        description="Opt-in triggers for its requests (queue_full), as a chain's.",
    )
    # The wait its requests accept for a cold local entry of a chain (not the last) before
    # they go on to the next (app.routing.patience); over the chain's own `max_wait_s`.
    max_wait_s: Annotated[float, Field(ge=0, le=3600)] | None = Field(
        None, description="The wait its requests accept for a cold chain entry; null: the chain's."
    )

    @model_validator(mode="after")
    def _one_secret(self) -> KeyConfig:
        if (self.key_env is None) == (self.key_sha256 is None):
            raise ValueError("needs exactly one of key_env (a variable name) or key_sha256")
        if self.key_sha256 is not None and not _SHA256.fullmatch(self.key_sha256.lower()):
            raise ValueError("key_sha256 must be 64 hex digits (sha256sum of the key)")
        return self

    def digest(self, environ: Mapping[str, str]) -> bytes:
        """The SHA-256 of the key's secret: as written (`key_sha256`) or of the value of
        its variable (`key_env`, which the configuration checks is set)."""
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        return secret_digest(environ.get(self.key_env or "", ""))

    @property
    def counts_tokens(self) -> bool:
        """Whether a limit needs every answer's token count (streams included)."""
        return self.tpm is not None or self.daily_cloud_tokens is not None


def secret_digest(secret: str) -> bytes:
    """The SHA-256 by which a client key is known (surrounding blanks are not part of it)."""
    return hashlib.sha256(secret.strip().encode()).digest()


class KeysConfig(StrictConfig):
    keys: dict[KeyName, KeyConfig] = Field(
        min_length=1,
        description="Client keys by name (the name shows in metrics and logs, never the secret).",
    )

    def unset_variables(self, environ: os._Environ[str] | dict[str, str]) -> list[str]:
        """`keys.NAME.key_env: VAR is not set` for every key whose variable is missing."""
        return [
            f"keys.{name}.key_env: {cfg.key_env} is not set (or empty) in the environment"
            for name, cfg in self.keys.items()
            if cfg.key_env is not None and not environ.get(cfg.key_env, "").strip()
        ]

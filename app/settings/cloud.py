"""`cloud_providers.yaml`: cloud providers and the fallback chains. The schema only; pure.

```yaml
providers:
  deepseek:
    kind: openai                      # an OpenAI-compatible API
    base_url: https://api.deepseek.com/v1   # as the OpenAI SDK takes it (with /v1)
    api_key_env: DEEPSEEK_API_KEY     # the variable holding the key, never the key
    model: deepseek-reasoner          # the id sent upstream, whatever the client asked for
    first_byte_timeout_s: 60          # optional; see below
  anthropic:
    kind: anthropic                   # the Messages API, translated both ways
    base_url: https://api.anthropic.com      # without /v1, as Anthropic's SDK takes it
    api_key_env: ANTHROPIC_API_KEY
    model: claude-sonnet-4-5
    max_tokens: 4096                  # required: used when the request sets none
chains:
  reasoning: [reasoning, deepseek, anthropic]   # short form: the entries only
  orchestrator:                                 # long form: entries and options
    entries: [orchestrator, deepseek]
    on_context_length: next
    wake_timeout_s: 5
circuit: {failure_threshold: 3, cooldown_s: 30}
```

A chain is keyed by a backend `role`, a model id or an alias of `models.yaml`; a request for
a model id or alias uses the chain keyed by that name, else the chain keyed by its
backend's role, else no chain (it is relayed exactly as without this file). Entries are
backend names of `models.yaml`, replica groups (`replica_of`: the member is picked per
request, and one that fails before the first byte is retried once on another) or provider
names, tried in order.

Provider options:
- `api_key_env`: the environment variable with the key (bearer for `openai`, `x-api-key`
  for `anthropic`). Unset or empty at start-up: the provider is skipped (warning, and
  `key_present: false` in `/status`). Leave `api_key_env` out for a server that takes no
  key. The key is never logged, returned or put in an error.
- `timeout_s`: connect timeout and the longest silence once the provider has started to
  answer (default: the gateway's `timeouts.connect_s` / `timeouts.idle_s`).
- `first_byte_timeout_s`: the wait for the first content (default `timeouts.first_byte_s`);
  a provider silent that long is a failure and the chain moves on. For a non-streaming
  request the first content is the whole answer.
- `cooldown_s`: how long its circuit stays open after repeated failures (default
  `circuit.cooldown_s`).
- `headers`: extra request headers (not `authorization`, `x-api-key` or framing ones).
- `max_tokens` (`anthropic`, required), `anthropic_version` (default `2023-06-01`).
- `cost_per_mtok: {input: 0.55, output: 2.19}`: its price per million prompt and
  completion tokens, for the cost estimate of `GET /usage` and the page (none: no estimate).
- `endpoints`: the APIs it is asked for (default: `chat, completions, embeddings, responses,
  transcriptions, translations, speech, images` for `openai`; `chat, messages` for
  `anthropic`, which can serve no other). A chain passes over a provider for any other
  (`unsupported_endpoint`).

Chain options (long form): `on_context_length` (`relay` | `next`), `fallback_on_status`
(4xx statuses that fall back; every 5xx always does), `wake_timeout_s` (how long a request
waits for a local backend of the chain to start or wake before trying the next entry;
the start goes on), `max_wait_s` (what a request accepts to wait for a cold local entry
that is not the last: one whose learned start or wake is longer is passed over at once,
`cold_start_budget`, while it warms; see `app.routing.patience`), `deadline_s` (one
deadline for finding an entry that answers), `max_attempts` (upstream requests per
client request), `auth_cooldown_s`, `fallback_on` (opt-in triggers, none by default:
`[queue_full]` lets a request move on past a busy local entry, which otherwise answers
503 `backend_queue_full` with `Retry-After`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from app.settings.backends import BackendConfig
from app.settings.base import StrictConfig, http_url
from app.settings.endpoints import (
    ANTHROPIC_PROVIDER_APIS,
    OPENAI_PROVIDER_APIS,
    Api,
    served_apis,
)

DEFAULT_FALLBACK_ON_STATUS = (429, 500, 502, 503, 504, 529)
# Local refusals that move a chain on only when its `fallback_on` (or the client key's)
# lists them: a busy local backend is a reason to wait, not to pay a provider.
FallbackTrigger = Literal["queue_full"]
# Headers a provider config may not set: the key goes through `api_key_env`; framing is ours.
_RESERVED_HEADERS = frozenset(
    {"authorization", "x-api-key", "content-length", "content-type", "host", "transfer-encoding"}
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class CostPerMtok(StrictConfig):
    """A provider's price per million tokens (in whatever currency it bills)."""

    input: NonNegativeFloat = Field(description="Price per million prompt tokens.")
    output: NonNegativeFloat = Field(description="Price per million completion tokens.")


class ProviderConfig(StrictConfig):
    kind: Literal["openai", "anthropic"] = Field(
        description=(
            "openai: an OpenAI-compatible API; anthropic: the Messages API, translated both ways."
        )
    )
    base_url: str = Field(
        description="Its base URL as its SDK takes it (openai: with /v1; anthropic: without)."
    )
    api_key_env: str | None = Field(
        None,
        description="The variable holding its key (never the key); unset: the provider is skipped.",
    )
    model: str = Field(
        min_length=1, description="The model id sent upstream, whatever the client asked for."
    )
    max_tokens: PositiveInt | None = Field(
        None, description="anthropic only, required: max_tokens when a request sets none."
    )
    anthropic_version: str = Field("2023-06-01", description="The anthropic-version header.")
    timeout_s: PositiveFloat | None = Field(
        None,
        description=(
            "Connect timeout and longest silence once it answers; null: timeouts.connect_s / "
            "idle_s."
        ),
    )
    first_byte_timeout_s: PositiveFloat | None = Field(
        None, description="Wait for the first content; null: timeouts.first_byte_s."
    )
    cooldown_s: PositiveFloat | None = Field(
        None,
        description=(
            "How long its circuit stays open after repeated failures; null: circuit.cooldown_s."
        ),
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="Extra request headers (not authorization, x-api-key or framing ones).",
    )
    max_connections: PositiveInt | None = Field(
        None, description="Cap on connections to it; null: none."
    )
    # Its price per million tokens, for the usage panel's cost estimate (none: not given).
    cost_per_mtok: CostPerMtok | None = Field(
        None,
        description="Its price per million tokens, for the usage cost estimate; null: no estimate.",
    )
    # What it is asked for; default: every OpenAI API for `openai`, chat and messages for
    # `anthropic` (app/settings/endpoints.py).
    endpoints: list[Api] | None = Field(
        default=None,
        min_length=1,
        description=(
            "The APIs it is asked for; null: every OpenAI API (openai), chat and messages "
            "(anthropic)."
        ),
    )

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[Api] | None) -> list[Api] | None:
        return served_apis(value)

    @property
    def apis(self) -> frozenset[Api]:
        default = OPENAI_PROVIDER_APIS if self.kind == "openai" else ANTHROPIC_PROVIDER_APIS
        return default if self.endpoints is None else frozenset(self.endpoints)

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        http_url(
            value,
            like="an http(s) URL like https://api.example.com/v1",
            plain=True,
            credentials="name the variable holding the key in api_key_env",
        )
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        # Never echo the value: someone may have pasted the key itself here.
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must be the name of an environment variable (letters, digits, _), "
                "not the key itself"
            )
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = sorted(name for name in value if name.lower() in _RESERVED_HEADERS)
        if reserved:
            raise ValueError(
                f"may not set {', '.join(reserved)} (the key comes from api_key_env; "
                "framing headers are the gateway's)"
            )
        return {name.lower(): text for name, text in value.items()}

    @model_validator(mode="after")
    def _kind_options(self) -> ProviderConfig:
        if self.kind == "anthropic":
            if self.max_tokens is None:
                raise ValueError(
                    "max_tokens: is required for kind anthropic (the Messages API requires "
                    "max_tokens; it is used when a request sets none)"
                )
            if urlsplit(self.base_url).path.rstrip("/").endswith("/v1"):
                raise ValueError(
                    "base_url: is Anthropic's base URL without /v1 "
                    "(https://api.anthropic.com); the gateway adds /v1/messages"
                )
        elif self.max_tokens is not None:
            raise ValueError("max_tokens: only applies to kind anthropic")
        if self.kind == "anthropic" and self.endpoints is not None:
            beyond = sorted(set(self.endpoints) - ANTHROPIC_PROVIDER_APIS)
            if beyond:
                raise ValueError(
                    f"endpoints: kind anthropic serves only chat and messages, not {beyond}"
                )
        return self


class ChainConfig(StrictConfig):
    entries: list[str] = Field(
        min_length=1, description="Backends, replica groups or providers, tried in order."
    )
    on_context_length: Literal["relay", "next"] = Field(
        "relay", description="A too-long prompt: relay the error, or try the next entry."
    )
    fallback_on_status: list[Annotated[int, Field(ge=400, le=599)]] = Field(
        default_factory=lambda: list(DEFAULT_FALLBACK_ON_STATUS),
        description="4xx statuses that move on to the next entry (every 5xx does).",
    )
    wake_timeout_s: NonNegativeFloat = Field(
        10.0,
        description="How long a request waits for a local entry to start or wake before the next.",
    )
    # Waits priced in (app.routing.patience); a client key's or the request's header wins.
    max_wait_s: NonNegativeFloat | None = Field(
        None,
        description=(
            "The wait a request accepts for a cold local entry (not the last); null: no limit."
        ),
    )
    deadline_s: PositiveFloat = Field(
        300.0, description="One deadline for finding an entry that answers."
    )
    max_attempts: PositiveInt = Field(3, description="Upstream requests per client request.")
    auth_cooldown_s: PositiveFloat = Field(
        300.0, description="How long an entry that refused the key (401/403) is skipped."
    )
    # Opt-in triggers (off by default): `queue_full` moves on past a local entry that is
    # busy (max_waiting requests held, or no slot within the wait) instead of answering
    # its 503 backend_queue_full with Retry-After.
    fallback_on: list[FallbackTrigger] = Field(
        default_factory=list,
        description="Opt-in triggers: queue_full moves on past a busy local entry.",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        return {"entries": value} if isinstance(value, list) else value

    @field_validator("entries")
    @classmethod
    def _unique(cls, entries: list[str]) -> list[str]:
        seen: set[str] = set()
        for entry in entries:
            if entry in seen:
                raise ValueError(f"{entry!r} is listed twice")
            seen.add(entry)
        return entries


class CircuitBreakerConfig(StrictConfig):
    """Defaults of every entry's circuit breaker (local backends and providers)."""

    failure_threshold: PositiveInt = Field(
        3, description="Consecutive failures that open an entry's circuit."
    )
    cooldown_s: PositiveFloat = Field(
        30.0, description="An open circuit skips the entry this long."
    )
    backoff: Annotated[float, Field(ge=1)] = Field(
        2.0, description="The cooldown is multiplied by this after a failed trial."
    )
    max_cooldown_s: PositiveFloat = Field(600.0, description="The longest cooldown.")

    @model_validator(mode="after")
    def _order(self) -> CircuitBreakerConfig:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s: must be at least cooldown_s")
        return self


class CloudConfig(StrictConfig):
    providers: dict[str, ProviderConfig] = Field(
        default_factory=dict, description="Cloud providers by name."
    )
    chains: dict[str, ChainConfig] = Field(
        default_factory=dict,
        description="Fallback chains, keyed by a backend role, a model id or an alias.",
    )
    circuit: CircuitBreakerConfig = Field(
        default_factory=CircuitBreakerConfig,
        description="Defaults of every entry's circuit breaker (local backends and providers).",
    )

    @field_validator("providers")
    @classmethod
    def _provider_names(cls, providers: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        for name in providers:
            if not _NAME.fullmatch(name):
                raise ValueError(f"{name!r}: provider names are letters, digits, '_', '.', '-'")
        return providers


def cross_check(cloud: CloudConfig, backends: Mapping[str, BackendConfig]) -> list[str]:
    """Problems between `cloud_providers.yaml` and `models.yaml`, as `key: problem` lines.

    A provider may not share a backend's (or a replica group's) name; a chain key must be
    a role, a model id or an alias; a chain entry must be a backend, a replica group (its
    member is picked per request) or a provider.
    """
    groups = {cfg.replica_of for cfg in backends.values() if cfg.replica_of}
    listed_groups = f", a replica group ({', '.join(sorted(groups))})" if groups else ""
    problems = [
        f"providers.{name}: is also the name of a "
        f"{'backend' if name in backends else 'replica group'} in models.yaml; names must differ"
        for name in cloud.providers
        if name in backends or name in groups
    ]
    keys = {cfg.role for cfg in backends.values() if cfg.role} | {
        name for cfg in backends.values() for name in (*cfg.models, *cfg.aliases)
    }
    for key, chain in cloud.chains.items():
        if key not in keys:
            problems.append(
                f"chains.{key}: names no backend role, model id or alias in models.yaml"
            )
        for index, entry in enumerate(chain.entries):
            if entry not in backends and entry not in groups and entry not in cloud.providers:
                problems.append(
                    f"chains.{key}.entries.{index}: {entry!r} is neither a backend in "
                    f"models.yaml ({', '.join(backends)}){listed_groups} nor a provider "
                    f"({', '.join(cloud.providers) or 'none'})"
                )
    return problems

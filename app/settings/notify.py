"""`notify:` in models.yaml: where the gateway posts what happened (webhooks, ntfy).

    notify:
      - url: https://hooks.example.org/gpu        # or url_env: NTFY_URL (a URL with a token)
        events: [yield, restore, backend_failed]  # default: every event
        format: json                              # or ntfy

A target's URL is never shown (logs and `/status` name its index and host only): a
topic or a token in it stays out of sight; `url_env` keeps it out of the file too.
"""

from __future__ import annotations

import os
from typing import Final, Literal

from pydantic import Field, PositiveFloat, field_validator, model_validator

from app.settings.base import StrictConfig, http_url

EVENTS: Final = (
    "yield",
    "restore",
    "auto_yield",
    "fallback_to_cloud",
    "budget_80",
    "budget_exhausted",
    "backend_failed",
    "sleep_guard",
    "config_reloaded",
)
_LIKE = "an http(s) URL such as https://ntfy.sh/my-gpu-topic"


class NotifyTarget(StrictConfig):
    url: str | None = Field(None, description="Where events are posted (one of url and url_env).")
    url_env: str | None = Field(
        default=None,
        min_length=1,
        description="The variable holding the URL, for one with a token (one of url and url_env).",
    )
    events: tuple[str, ...] = Field(EVENTS, description="The events posted.")
    format: Literal["json", "ntfy"] = Field(
        "json", description="json: the event as JSON; ntfy: a ntfy message."
    )
    timeout_s: PositiveFloat = Field(5.0, description="Timeout of each post.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            http_url(value, like=_LIKE, credentials="use url_env for a URL with a secret")
        return value

    @field_validator("events")
    @classmethod
    def _events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [e for e in value if e not in EVENTS]
        if unknown:
            raise ValueError(f"unknown event {unknown[0]!r} (events: {', '.join(EVENTS)})")
        return value

    @model_validator(mode="after")
    def _one_url(self) -> NotifyTarget:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("set exactly one of url and url_env")
        if self.url_env is not None:
            value = os.environ.get(self.url_env, "")
            if not value:
                raise ValueError(f"url_env: the variable {self.url_env} is unset or empty")
            try:
                http_url(value, like=_LIKE)
            except ValueError as exc:
                raise ValueError(f"url_env: {self.url_env} {exc}") from None
        return self

    def resolved_url(self) -> str:
        """The URL to post to (from the environment for `url_env`)."""
        if self.url is not None:
            return self.url
        assert self.url_env is not None
        return os.environ.get(self.url_env, "")

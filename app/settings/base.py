"""The base of every config class: unknown keys are errors, values are frozen."""

from __future__ import annotations

from typing import Final
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict


class StrictConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# The gateway's own machine, in `host:` and wherever a host is named (`hosts:` are others).
LOCAL_HOST: Final = "local"


def http_url(value: str, *, like: str, plain: bool = False, credentials: str = "") -> SplitResult:
    """Check an http(s) URL of the configuration; its parts. `like` is the example the
    message gives. `plain`: no query or fragment either. Never a user:password in it (URLs
    show in errors, logs and /status); `credentials` says what to do instead."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be {like}, got {value!r}")
    no_credentials(parts, instead=credentials)
    if plain and (parts.query or parts.fragment):
        raise ValueError("must not carry a query or fragment")
    return parts


def no_credentials(parts: SplitResult, *, instead: str = "") -> None:
    """URLs are named in errors, logs and /status: a user:password in one would leak."""
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "must not carry credentials (user:password@): the URL shows in errors, logs "
            "and /status" + (f"; {instead}" if instead else "")
        )

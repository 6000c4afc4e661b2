"""The base of every config class: unknown keys are errors, values are frozen."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict


class StrictConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# The gateway's own machine, in `host:` and wherever a host is named (`hosts:` are others).
LOCAL_HOST: Final = "local"

"""A backend's network timeouts (`timeouts:` gateway-wide and per backend)."""

from __future__ import annotations

from pydantic import (
    Field,
    PositiveFloat,
)

from app.settings.base import StrictConfig


class TimeoutsConfig(StrictConfig):
    """Network waits of the data plane, and of the control calls to a local vLLM. Streams
    never get a total timeout.

    `first_byte_s` bounds the wait for the response headers and the first body chunk;
    for a non-streaming request that is the whole generation, hence the long default.
    `control_s` bounds each sleep-mode call to a backend's vLLM (sleep, wake, the weights
    reload of a level-2 wake, the confirmation by `/is_sleeping`); None: scaled by the
    size of the backend's weights (`app.upstreams.vllm.control_timeout_s`).
    """

    connect_s: PositiveFloat = Field(
        5.0, description="TCP connect to a backend or provider, in seconds."
    )
    first_byte_s: PositiveFloat = Field(
        300.0,
        description=(
            "Wait for the response headers and the first body chunk (a non-streaming request: the "
            "whole generation)."
        ),
    )
    idle_s: PositiveFloat = Field(
        60.0,
        description=(
            "Longest silence between two chunks of a response; streams have no total timeout."
        ),
    )
    control_s: PositiveFloat | None = Field(
        None,
        description=(
            "Each sleep-mode call to a local vLLM (sleep, wake, reload); null: scaled by the size "
            "of its weights."
        ),
    )


class TimeoutOverridesConfig(StrictConfig):
    connect_s: PositiveFloat | None = Field(
        None, description="This backend's connect timeout; null: the top-level timeouts.connect_s."
    )
    first_byte_s: PositiveFloat | None = Field(
        None,
        description="This backend's first-byte timeout; null: the top-level timeouts.first_byte_s.",
    )
    idle_s: PositiveFloat | None = Field(
        None, description="This backend's idle timeout; null: the top-level timeouts.idle_s."
    )
    control_s: PositiveFloat | None = Field(
        None,
        description=(
            "This backend's sleep-mode call timeout; null: the top-level timeouts.control_s."
        ),
    )

    def apply(self, base: TimeoutsConfig) -> TimeoutsConfig:
        # Validated as a whole (a `model_copy(update=...)` would skip every check).
        return TimeoutsConfig.model_validate(
            {**base.model_dump(), **self.model_dump(exclude_none=True)}
        )

"""GPU profiles: the schema's checks and the pure decisions (what a switch changes)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.lifecycle.profile_switch import diff
from app.settings.profiles import GpuProfilesConfig, ProfileConfig

ARTICLE = {
    "profiles": {
        "dev": {
            "vram_strategy": "shared",
            "gpu_total_gb": 32,
            "target_utilization_pct": 76,
            "models": {
                "orchestrator": {"vram_pct": 40, "cuda_graphs": True},
                "reasoning": {"enabled": True, "vram_pct": 35, "sleep_mode": True},
            },
        },
        "production": {
            "target_utilization_pct": 92,
            "models": {"orchestrator": {"vram_pct": 92}, "reasoning": {"enabled": False}},
        },
    },
    "active": "dev",
}


def profiles(data: dict[str, Any]) -> GpuProfilesConfig:
    return GpuProfilesConfig.model_validate(data)


def test_the_articles_profiles_are_valid() -> None:
    parsed = profiles(ARTICLE)
    assert parsed.default == "dev"
    assert parsed.profiles["production"].enabled("reasoning") is False
    assert parsed.profiles["production"].enabled("embeddings") is True  # not listed


def test_without_active_the_first_profile_is_the_default() -> None:
    assert profiles({**ARTICLE, "active": None}).default == "dev"


def test_an_unknown_active_profile_is_refused() -> None:
    with pytest.raises(ValidationError, match="active: 'gaming' is not a profile"):
        profiles({**ARTICLE, "active": "gaming"})


def test_shares_above_the_target_are_refused_with_the_sum() -> None:
    with pytest.raises(ValidationError) as info:
        ProfileConfig.model_validate(
            {"target_utilization_pct": 70, "models": {"a": {"vram_pct": 40}, "b": {"vram_pct": 35}}}
        )
    assert "add up to 75% (a 40 + b 35), more than target_utilization_pct 70%" in str(info.value)


def test_a_disabled_models_share_does_not_count() -> None:
    profile = ProfileConfig.model_validate(
        {
            "target_utilization_pct": 50,
            "models": {"a": {"vram_pct": 40}, "b": {"vram_pct": 35, "enabled": False}},
        }
    )
    assert profile.enabled("b") is False


@pytest.mark.parametrize("pct", [0, -5, 101])
def test_percentages_must_be_in_range(pct: float) -> None:
    with pytest.raises(ValidationError):
        ProfileConfig.model_validate({"models": {"a": {"vram_pct": pct}}})


def test_exclusive_allows_one_planned_instance() -> None:
    with pytest.raises(ValidationError, match="exclusive gives the GPU to one instance"):
        ProfileConfig.model_validate(
            {"vram_strategy": "exclusive", "models": {"a": {"vram_pct": 40}, "b": {"vram_pct": 40}}}
        )


def test_planned_mib_uses_the_profiles_gpu_size_or_the_probes() -> None:
    dev = profiles(ARTICLE).profiles["dev"]
    assert dev.planned_mib("orchestrator", gpu_total_mib=None) == int(32 * 1024 * 0.40)
    production = profiles(ARTICLE).profiles["production"]
    assert production.planned_mib("orchestrator", gpu_total_mib=24576) == int(24576 * 0.92)
    assert production.planned_mib("orchestrator", gpu_total_mib=None) is None
    assert production.planned_mib("reasoning", gpu_total_mib=24576) is None  # disabled


def test_diff_names_what_a_switch_turns_off_and_on() -> None:
    parsed = profiles(ARTICLE)
    names = ["orchestrator", "reasoning", "embeddings"]
    to_production = diff(names, parsed.profiles["dev"], parsed.profiles["production"])
    assert to_production.disable == ("reasoning",)
    assert to_production.enable == ()
    back = diff(names, parsed.profiles["production"], parsed.profiles["dev"])
    assert back.disable == ()
    assert back.enable == ("reasoning",)
    from_nothing = diff(names, None, parsed.profiles["production"])
    assert from_nothing.disable == ("reasoning",)

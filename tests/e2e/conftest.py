from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """A system tool a test needs: CI must have it (fail); elsewhere, skip and say why."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MICROSCHEDULER_REQUIRE_SYSTEM_TOOLS") or os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs it on CI machines")
        pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus)")
    return path

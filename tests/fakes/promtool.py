"""`promtool check metrics` on a scrape of the gateway.

The GPU families keep dcgm-exporter's label names (`UUID`, `modelName`) so they join with
a dcgm-exporter's series and dashboards; promtool's style lint flags exactly those (exit
3: lint findings, not errors). Anything else it says is a failure.
"""

from __future__ import annotations

import re
import subprocess
from typing import Final

CAMEL_CASE_LINT: Final = re.compile(
    r"(microscheduler_gpu_[a-z_]+) label names should be written in 'snake_case' not 'camelCase'"
)


def run_check(promtool: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


def check_metrics(promtool: str, text: str) -> set[str]:
    """Assert promtool finds nothing but the dcgm label-name lint; return the families it
    flagged for it."""
    result = run_check(promtool, text)
    if result.returncode == 0:
        return set()
    assert result.returncode == 3, result.stdout + result.stderr
    flagged = set()
    for line in result.stderr.strip().splitlines():
        match = CAMEL_CASE_LINT.fullmatch(line)
        assert match is not None, f"promtool: {line}"
        flagged.add(match.group(1))
    without_gpu = "".join(
        line + "\n" for line in text.splitlines() if "microscheduler_gpu_" not in line
    )
    clean = run_check(promtool, without_gpu)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    return flagged

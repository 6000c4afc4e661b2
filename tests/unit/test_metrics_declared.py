"""Every series of the gateway is named through `app.metrics` (`Declare`, or `series_name`
for a collector's families): no module makes a prometheus_client metric itself or writes
the `microscheduler_` prefix into a family's name. The fake vLLM (`app.sim`) is exempt: its
series are vLLM's own (`vllm:...`). Read with `ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
MADE_HERE = frozenset({"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"})
FAMILIES = frozenset({"GaugeMetricFamily", "CounterMetricFamily", "HistogramMetricFamily"})
EXEMPT = ("metrics.py", "sim/")


def offences(relative: str, source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
        if name in MADE_HERE:
            found.append(f"{relative}:{node.lineno} makes a {name} (use app.metrics.Declare)")
        elif name in FAMILIES and node.args:
            first = node.args[0]
            text = first.value if isinstance(first, ast.Constant) else None
            if isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                text = first.values[0].value
            if isinstance(text, str) and text.startswith("microscheduler_"):
                found.append(f"{relative}:{node.lineno} names {text!r} (use series_name)")
    return found


def test_the_check_catches_a_metric_made_by_hand() -> None:
    source = (
        "Gauge('x', 'doc', namespace='microscheduler')\n"
        "prometheus_client.Counter('y', 'doc')\n"
        "GaugeMetricFamily(f'microscheduler_gpu_{n}', 'doc')\n"
        "GaugeMetricFamily(series_name('gpu_up'), 'doc')\n"
    )
    assert offences("m.py", source) == [
        "m.py:1 makes a Gauge (use app.metrics.Declare)",
        "m.py:2 makes a Counter (use app.metrics.Declare)",
        "m.py:3 names 'microscheduler_gpu_' (use series_name)",
    ]


def test_every_series_is_declared_through_app_metrics() -> None:
    found = []
    for path in sorted(APP.rglob("*.py")):
        relative = path.relative_to(APP).as_posix()
        if not relative.startswith(EXEMPT):
            found += offences(relative, path.read_text(encoding="utf-8"))
    assert found == []

"""The monitoring assets in deploy/: the Prometheus config and alerts, the Grafana dashboard.

They are checked with the real `promtool` and against a real scrape of the gateway, so a
renamed or missing metric fails here instead of leaving an empty panel nobody looks at.
`promtool` (2.42, Debian's) has no offline PromQL parser command, but `check rules`
parses every expression it is given: the dashboard's queries go through it as
recording rules, with Grafana's variables replaced by sample values.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import require_tool
from tests.fakes.servers import fake_vllm, gateway, gateway_settings

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
RULES = DEPLOY / "prometheus-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "microscheduler-dashboard.json"

DATASOURCE_UID = "${DS_PROMETHEUS}"
METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])microscheduler_[a-z0-9_]+")
GRAFANA_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
# Values that make a query valid PromQL for promtool; `backend` is the dashboard's own.
GRAFANA_VALUES = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h", "backend": ".*"}


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, input=stdin, capture_output=True, timeout=60, check=False)


def output(result: subprocess.CompletedProcess[bytes]) -> str:
    return (result.stdout + result.stderr).decode(errors="replace")


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expr) for every target of every panel and every query variable."""
    dashboard = load_dashboard()
    queries = [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in all_panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            expr = query if isinstance(query, str) else query["query"]
            queries.append((f"variable {variable['name']}", expr))
    return queries


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    return [
        (f"rule {rule.get('alert') or rule.get('record')}", rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
    ]


def substitute_grafana_variables(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in GRAFANA_VALUES, f"no sample value for Grafana variable ${name}"
        return GRAFANA_VALUES[name]

    return GRAFANA_VARIABLE.sub(value, expr)


def exposed_names(text: str) -> set[str]:
    """Every series name the scrape can have: its samples, plus the names a family with no
    children yet (a labelled metric nothing has touched) will expose once it has some."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":  # the parser strips `_total` from counter families
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        elif family.type == "summary":
            names.update(family.name + suffix for suffix in ("", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


# --- (a) Prometheus config and alert rules ------------------------------------------------


def test_prometheus_config_and_rules_pass_promtool() -> None:
    promtool = require_tool("promtool")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["rule_files"] == [RULES.name]  # loads what it ships and nothing else
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway_job = jobs["microscheduler"]
    assert gateway_job["metrics_path"] == "/metrics"
    assert gateway_job["static_configs"] == [{"targets": ["gateway:8080"]}]

    checked = run(promtool, "check", "config", str(PROMETHEUS_CONFIG))
    assert checked.returncode == 0, output(checked)
    checked = run(promtool, "check", "rules", str(RULES))
    assert checked.returncode == 0, output(checked)


ALERT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'microscheduler_backend_state{{backend="reasoning",state="failed"}}'
        values: '0 1x5'
      - series: 'microscheduler_backend_state{{backend="orchestrator",state="failed"}}'
        values: '0x5'
      - series: 'microscheduler_backend_state{{backend="embeddings",state="ready"}}'
        values: '1x5'
      - series: 'microscheduler_backend_up{{backend="embeddings"}}'
        values: '1 0x5'
      - series: 'microscheduler_backend_state{{backend="reasoning",state="ready"}}'
        values: '0x5'
      - series: 'microscheduler_backend_up{{backend="reasoning"}}'
        values: '0x5'
    alert_rule_test:
      - eval_time: 1m
        alertname: MicroschedulerBackendFailed
        exp_alerts: []
      - eval_time: 3m
        alertname: MicroschedulerBackendFailed
        exp_alerts:
          - exp_labels: {{severity: critical, backend: reasoning, state: failed}}
            exp_annotations:
              summary: >-
                Backend reasoning failed (start or health); requests to it fail or fall back
      - eval_time: 4m
        alertname: MicroschedulerBackendUnhealthy
        exp_alerts:
          - exp_labels: {{severity: warning, backend: embeddings}}
            exp_annotations:
              summary: >-
                Backend embeddings is ready for the gateway but fails its health check

  - interval: 1m
    input_series:
      - series: >-
          microscheduler_gpu_memory_used_bytes{{host="local",gpu="0",
          UUID="GPU-a",modelName="RTX 5090"}}
        values: '33822867456x15'
      - series: >-
          microscheduler_gpu_memory_total_bytes{{host="local",gpu="0",
          UUID="GPU-a",modelName="RTX 5090"}}
        values: '34190917632x15'
      - series: >-
          microscheduler_gpu_memory_used_bytes{{host="local",gpu="1",
          UUID="GPU-b",modelName="RTX 5090"}}
        values: '30000000000x15'
      - series: >-
          microscheduler_gpu_memory_total_bytes{{host="local",gpu="1",
          UUID="GPU-b",modelName="RTX 5090"}}
        values: '34190917632x15'
      - series: 'microscheduler_circuit_open{{entry="openai"}}'
        values: '0 1x5 0'
    alert_rule_test:
      - eval_time: 5m
        alertname: MicroschedulerVramNearlyFull
        exp_alerts: []
      - eval_time: 12m
        alertname: MicroschedulerVramNearlyFull
        exp_alerts:
          - exp_labels:
              {{severity: warning, host: local, gpu: "0", UUID: GPU-a, modelName: RTX 5090}}
            exp_annotations:
              summary: local GPU 0 VRAM is 98.92% used
              description: >-
                Lazy backends will be refused or evict others; check for memory not
                placed by the gateway.
      - eval_time: 4m
        alertname: MicroschedulerCircuitOpen
        exp_alerts:
          - exp_labels: {{severity: warning, entry: openai}}
            exp_annotations:
              summary: Circuit for fallback entry openai is open; requests skip it
      - eval_time: 7m
        alertname: MicroschedulerCircuitOpen
        exp_alerts: []

  - interval: 1m
    input_series:
      - series: 'microscheduler_sleep_guard_total{{backend="embed",cause="leak"}}'
        values: '0x3 1x70'
      - series: 'microscheduler_sleep_guard_total{{backend="embed",cause="wake_failed"}}'
        values: '0x73'
    alert_rule_test:
      - eval_time: 2m
        alertname: MicroschedulerSleepGuardStopped
        exp_alerts: []
      - eval_time: 5m
        alertname: MicroschedulerSleepGuardStopped
        exp_alerts:
          - exp_labels: {{severity: warning, backend: embed, cause: leak}}
            exp_annotations:
              summary: The sleep guard stopped backend embed (leak) in the last hour
              description: >-
                Its sleep_guard event in /status has the numbers. Again and again: free it
                with method stop instead of sleep (idle:, eviction:, yield:).
      - eval_time: 70m
        alertname: MicroschedulerSleepGuardStopped
        exp_alerts: []

  - interval: 1m
    input_series:
      - series: 'microscheduler_event_loop_lag_max_seconds'
        values: '0.002 0.8x6 0.8 0.8 0.003x3'
    alert_rule_test:
      - eval_time: 4m
        alertname: MicroschedulerEventLoopStalled
        exp_alerts: []
      - eval_time: 7m
        alertname: MicroschedulerEventLoopStalled
        exp_alerts:
          - exp_labels: {{severity: warning}}
            exp_annotations:
              summary: The gateway's event loop stalled 800ms in the last minute
      - eval_time: 11m
        alertname: MicroschedulerEventLoopStalled
        exp_alerts: []
"""


def test_alerts_fire_when_they_should(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    tests = tmp_path / "alerts.test.yml"
    tests.write_text(ALERT_TESTS.format(rules=json.dumps(str(RULES))))
    result = run(promtool, "test", "rules", str(tests))
    assert result.returncode == 0, output(result)


# --- (b) the dashboard is importable and every panel queries something ---------------------


def test_dashboard_is_importable_and_every_panel_has_a_query() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "microscheduler"
    assert dashboard["title"] == "microscheduler"
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    datasource = variables["DS_PROMETHEUS"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")

    panels = list(all_panels(dashboard["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    for panel in panels:
        where = f"panel {panel['id']}"
        assert isinstance(panel.get("title"), str), where
        assert panel["title"].strip(), where
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, where
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, where
        targets = panel.get("targets", [])
        assert targets, f"{where} {panel['title']!r} has no targets"
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in targets:
            assert isinstance(target.get("expr"), str), where
            assert target["expr"].strip(), f"{where} target {target['refId']} has no expr"
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], where

    # Every variable a query uses is defined (or one of Grafana's own).
    for where, expr in dashboard_queries():
        for match in GRAFANA_VARIABLE.finditer(expr):
            name = match.group(1) or match.group(2)
            assert name.startswith("__") or name in variables, f"{where}: ${name} undefined"


# --- (c) every metric a query names is exposed by the gateway -----------------------------


async def test_every_metric_in_the_dashboard_and_alerts_is_exposed() -> None:
    used: dict[str, list[str]] = {}
    for where, expr in dashboard_queries() + alert_queries():
        for name in METRIC_NAME.findall(expr):
            used.setdefault(name, []).append(where)
    assert used

    async with fake_vllm(models=["nemotron-8b"], max_tokens=2) as upstream:
        backend = {"url": upstream.url, "models": ["nemotron-8b"], "aliases": ["default"]}
        # The dashboard's GPU panels read the probe's series: a GPU it sees (simulated).
        settings = gateway_settings({"orchestrator": backend}, gpu={"probe": "sim"})
        async with gateway(settings) as gw:
            chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
            response = await gw.client.post("/v1/chat/completions", json=chat)
            assert response.status_code == 200
            scrape = await gw.client.get("/metrics")
            assert scrape.status_code == 200
    exposed = exposed_names(scrape.text)

    missing = {name: wheres for name, wheres in sorted(used.items()) if name not in exposed}
    assert not missing, "metrics used in deploy/ but absent from a scrape:\n" + "\n".join(
        f"  {name}: {', '.join(wheres)}" for name, wheres in missing.items()
    )


# --- (d) every dashboard query parses as PromQL -------------------------------------------


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    queries = [
        (where, expr)
        for where, expr in dashboard_queries()
        if not where.startswith("variable")  # label_values() is Grafana's, not PromQL
    ]
    # One group per query, named after it, so promtool's error says which one it was.
    groups: list[dict[str, Any]] = []
    for i, (where, expr) in enumerate(queries):
        rule = {"record": f"dashboard:query_{i}", "expr": substitute_grafana_variables(expr)}
        groups.append({"name": where, "rules": [rule]})
    rules = tmp_path / "dashboard-queries.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = run(promtool, "check", "rules", str(rules))
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(queries)} rules found" in output(result)

"""A stand-in Prometheus for tests: its HTTP query API over series shaped like
dcgm-exporter's, on a real port of 127.0.0.1.

What it follows, and from where:
- `GET`/`POST /api/v1/query` with `query` and optional `time` (prometheus.io, "HTTP API",
  "Instant queries"); the envelope `{"status": "success", "data": {"resultType", "result"}}`
  and, on error, `{"status": "error", "errorType", "error"}` with 400 for a missing or
  unparseable query (`bad_data`) and 503 when the query times out or aborts (`timeout`)
  ("Format overview").
- Result formats ("Expression query result formats"): an instant vector is `vector` with
  `"value": [<eval time>, "<value>"]` (the evaluation time, not the sample's); a range
  vector is `matrix` with `"values": [[<sample ts>, "<value>"], ...]`, oldest first.
  Values are strings, including `"NaN"`, `"+Inf"`, `"-Inf"`.
- An instant vector only sees samples up to 5 minutes old (the default lookback delta,
  "Querying basics", "Staleness"); a range `[d]` sees samples in `(t - d, t]`.
- PromQL understood: one selector, `name{matchers}` or `{matchers}`, with `=`, `!=`,
  `=~`, `!~` (regexes fully anchored) and an optional range `[<n>s|m|h]`. Anything else
  is a 400 parse error, as Prometheus answers an invalid expression.
- Series labels as dcgm-exporter renders them (NVIDIA/dcgm-exporter README example and
  `internal/pkg/rendermetrics`): `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
  `Hostname`, `DCGM_FI_DRIVER_VERSION`, plus the `job` and `instance` Prometheus adds at
  scrape; units from `etc/default-counters.csv` (MiB, %, C, W).

Switches: `go_down()` / `come_back()` close and reopen the port (connection refused in
between); `unavailable = True` answers 503; `delay_s` answers late; `sample_age_s`
makes every sample that old; `series` may be edited freely. `queries` and `headers`
record what was asked.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

LOOKBACK_DELTA_S: Final = 300.0
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_SELECTOR = re.compile(
    r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)?\s*(?:\{(.*)\})?\s*(?:\[(\d+)([smh])\])?\s*$"
)
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600}


class ParseError(Exception):
    pass


@dataclass
class Series:
    labels: dict[str, str]
    value: float
    scrape_interval_s: float = 15.0


def dcgm_gpu(
    index: int,
    *,
    host: str = "node-c",
    uuid: str | None = None,
    model: str = "NVIDIA A100-SXM4-80GB",
    used_mib: float = 1024,
    free_mib: float = 80000,
    reserved_mib: float | None = 486,
    util_pct: float | None = 35,
    mem_copy_util_pct: float | None = 10,
    temp_c: float | None = 41,
    power_w: float | None = 87.5,
    driver: str | None = "550.54.15",
) -> list[Series]:
    """The default-counter series one dcgm-exporter exposes for GPU `index` on `host`."""
    labels = {
        "gpu": str(index),
        "UUID": uuid or f"GPU-{host}-{index:04d}",
        "pci_bus_id": f"00000000:{index + 7:02X}:00.0",
        "device": f"nvidia{index}",
        "modelName": model,
        "Hostname": host,
        "job": "dcgm-exporter",
        "instance": f"{host}:9400",
    }
    if driver is not None:
        labels["DCGM_FI_DRIVER_VERSION"] = driver
    values = {
        "DCGM_FI_DEV_FB_USED": used_mib,
        "DCGM_FI_DEV_FB_FREE": free_mib,
        "DCGM_FI_DEV_FB_RESERVED": reserved_mib,
        "DCGM_FI_DEV_GPU_UTIL": util_pct,
        "DCGM_FI_DEV_MEM_COPY_UTIL": mem_copy_util_pct,
        "DCGM_FI_DEV_GPU_TEMP": temp_c,
        "DCGM_FI_DEV_POWER_USAGE": power_w,
        "DCGM_FI_DEV_SM_CLOCK": 1410,  # read by nobody: must be filtered out by the query
    }
    return [
        Series({"__name__": name, **labels}, value)
        for name, value in values.items()
        if value is not None
    ]


def node_memory(
    *, host: str = "node-c", total_bytes: float, available_bytes: float, port: int = 9100
) -> list[Series]:
    """The two meminfo series of node-exporter on `host` (its meminfo collector, bytes),
    with the `job` and `instance` labels a Prometheus adds."""
    labels = {"job": "node-exporter", "instance": f"{host}:{port}"}
    return [
        Series({"__name__": "node_memory_MemTotal_bytes", **labels}, total_bytes),
        Series({"__name__": "node_memory_MemAvailable_bytes", **labels}, available_bytes),
        Series({"__name__": "node_memory_MemFree_bytes", **labels}, available_bytes / 4),
    ]


def exposition(series: list[Series]) -> str:
    """`series` as a dcgm-exporter `/metrics` page (text format 0.0.4), without the `job`
    and `instance` labels a Prometheus adds when it scrapes."""
    by_name: dict[str, list[str]] = {}
    for s in series:
        name = s.labels["__name__"]
        labels = ",".join(
            f'{k}="{v}"' for k, v in s.labels.items() if k not in ("__name__", "job", "instance")
        )
        by_name.setdefault(name, []).append(f"{name}{{{labels}}} {_format(s.value)}")
    lines = [line for name, rows in by_name.items() for line in (f"# TYPE {name} gauge", *rows)]
    return "\n".join(lines) + "\n"


def _format(value: float) -> str:
    # Prometheus renders sample values as strings (strconv.FormatFloat 'f', -1, and
    # "NaN", "+Inf", "-Inf").
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if value != int(value) else str(int(value))


def _parse(query: str) -> tuple[str | None, list[tuple[str, str, str]], float | None]:
    match = _SELECTOR.match(query)
    if match is None or (match.group(1) is None and match.group(2) is None):
        raise ParseError(f'1:1: parse error: unexpected input in query "{query}"')
    name, body, amount, unit = match.groups()
    matchers: list[tuple[str, str, str]] = []
    rest = (body or "").strip()
    while rest:
        m = _MATCHER.match(rest)
        if m is None:
            raise ParseError(f"parse error: unexpected character inside braces: {rest!r}")
        matchers.append(
            (m.group(1), m.group(2), bytes(m.group(3), "utf-8").decode("unicode_escape"))
        )
        rest = rest[m.end() :].strip()
    if name is not None:
        matchers.append(("__name__", "=", name))
    if not any(op in ("=", "=~") and not _matches(op, value, "") for _, op, value in matchers):
        raise ParseError("parse error: vector selector must contain at least one non-empty matcher")
    window = None if amount is None else float(int(amount) * _UNIT_S[unit])
    return name, matchers, window


def _matches(op: str, expected: str, actual: str) -> bool:
    if op == "=":
        return actual == expected
    if op == "!=":
        return actual != expected
    hit = re.fullmatch(expected, actual) is not None
    return hit if op == "=~" else not hit


@dataclass
class FakePrometheus:
    series: list[Series] = field(default_factory=list)
    sample_age_s: float = 0.0
    unavailable: bool = False
    delay_s: float = 0.0  # before answering (a slow or hung Prometheus)
    queries: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _port: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        app.router.add_post("/api/v1/query", self._query)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()
        self._port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self._port}"

    async def go_down(self) -> None:
        """Close the port: connections are refused until `come_back()`."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def come_back(self) -> None:
        await self.start()

    async def _query(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        self.headers.append(dict(request.headers))
        query = params.get("query")
        if query is None:
            return _error(400, "bad_data", 'invalid parameter "query": no query provided')
        self.queries.append(query)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.unavailable:
            return _error(503, "timeout", "query timed out in expression evaluation")
        try:
            _, matchers, window = _parse(query)
            now = float(params["time"]) if "time" in params else time.time()
        except (ParseError, re.error, ValueError) as exc:
            return _error(400, "bad_data", f'invalid parameter "query": {exc}')
        newest = now - self.sample_age_s
        result: list[dict[str, Any]] = []
        for series in self.series:
            if not all(_matches(op, v, series.labels.get(k, "")) for k, op, v in matchers):
                continue
            if window is None:
                if now - newest > LOOKBACK_DELTA_S:
                    continue
                result.append({"metric": series.labels, "value": [now, _format(series.value)]})
                continue
            stamps = []
            ts = newest
            while ts > now - window:
                stamps.append(ts)
                ts -= series.scrape_interval_s
            if stamps:
                values = [[round(t, 3), _format(series.value)] for t in reversed(stamps)]
                result.append({"metric": series.labels, "values": values})
        if window is not None:
            return web.json_response(
                {"status": "success", "data": {"resultType": "matrix", "result": result}}
            )
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response(
        {"status": "error", "errorType": error_type, "error": message}, status=status
    )


@asynccontextmanager
async def fake_prometheus(*series: Series) -> AsyncIterator[FakePrometheus]:
    """A started `FakePrometheus` holding `series`; stopped on exit."""
    prometheus = FakePrometheus(series=list(series))
    await prometheus.start()
    try:
        yield prometheus
    finally:
        await prometheus.go_down()

"""PrometheusSource: another host's GPUs, read from the dcgm-exporter series in a Prometheus.

One sample is one instant query on Prometheus's HTTP API (prometheus.io, "HTTP API",
`GET /api/v1/query`) for every DCGM metric the probe reads at once, with the configured
label matchers (`gpu.prometheus.selector`) and a range:

    {__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE|...",Hostname="node-c"}[120s]

- A range selector (not an instant one) because Prometheus stamps an instant vector's
  samples with the *evaluation* time; a range vector (result type `matrix`) keeps each
  sample's own scrape timestamp, and the snapshot's age must be the data's age (a
  Prometheus sample is at least one scrape old). The newest sample of each series counts.
  One query with a `__name__` regex keeps the metric name on every series (functions such
  as `timestamp()` would drop it), so one round trip reads everything.
- Metrics and units are dcgm-exporter's defaults (NVIDIA/dcgm-exporter
  `etc/default-counters.csv`): `DCGM_FI_DEV_FB_USED`, `_FB_FREE`, `_FB_RESERVED` in MiB,
  `DCGM_FI_DEV_GPU_UTIL` and `_MEM_COPY_UTIL` in %, `DCGM_FI_DEV_GPU_TEMP` in C,
  `DCGM_FI_DEV_POWER_USAGE` in W. Labels as dcgm-exporter renders them (its README and
  `internal/pkg/rendermetrics`): `gpu` (the index, the key here), `UUID`, `modelName`,
  `Hostname`, `DCGM_FI_DRIVER_VERSION`.
- FB_USED and FB_FREE are required; the others are optional (missing, NaN or infinite:
  the field is None, never 0). Total is used + free + reserved, and used counts the
  reserved memory (as NVML's v1 memory info does), so free = total - used.
- A GPU with one of FB_USED/FB_FREE but not the other, or with a non-finite one, is
  reported lost (admission skips it, its metrics say `lost 1`).
- Several series for one GPU and one metric: the same `UUID` (the same exporter scraped
  by two jobs) takes the newest sample; different UUIDs mean the selector matches several
  hosts, and the sample fails saying so. MIG instances (`GPU_I_ID`) are not supported.

Failures (Prometheus unreachable, timed out, answering an error or no FB series for the
selector) raise `ProbeError` with one line naming the URL and the reason; the poller then
shows the probe down exactly as for a lost NVML. Samples are taken at most every
`query_interval_s` (in between, the last answer is repeated), one query at a time.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from app.gpu.telemetry import MIB, GpuSnapshot, GpuStats, ProbeError
from app.settings import PrometheusProbeConfig
from app.upstreams.control_http import (
    AsyncBaseTransport,
    HTTPError,
    Timeout,
    TimeoutException,
    async_client,
)

FB_USED: Final = "DCGM_FI_DEV_FB_USED"
FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED: Final = "DCGM_FI_DEV_FB_RESERVED"
GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL: Final = "DCGM_FI_DEV_MEM_COPY_UTIL"
GPU_TEMP: Final = "DCGM_FI_DEV_GPU_TEMP"
POWER_USAGE: Final = "DCGM_FI_DEV_POWER_USAGE"
METRICS: Final = (FB_USED, FB_FREE, FB_RESERVED, GPU_UTIL, MEM_COPY_UTIL, GPU_TEMP, POWER_USAGE)
DRIVER_LABEL: Final = "DCGM_FI_DRIVER_VERSION"


def build_query(selector: str, lookback_s: int) -> str:
    """The PromQL of one sample: every DCGM metric read, the selector's matchers, a range."""
    names = f'__name__=~"{"|".join(METRICS)}"'
    inner = selector.strip()[1:-1].strip().rstrip(",").strip() if selector.strip() else ""
    matchers = f"{names},{inner}" if inner else names
    return f"{{{matchers}}}[{lookback_s}s]"


@dataclass(frozen=True, slots=True)
class Reading:
    """The newest sample of one series: metric, GPU, its labels, value and timestamp."""

    metric: str
    gpu: int
    uuid: str
    labels: Mapping[str, str]
    value: float
    ts: float


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    labels: Mapping[str, str]
    values: dict[str, Reading] = field(default_factory=dict)


class _BadResponse(Exception):
    """The body is not the documented shape (said in words, turned into a ProbeError)."""


def readings(body: object) -> list[Reading]:
    """The newest sample of each DCGM series in a `/api/v1/query` answer of result type
    `matrix` (prometheus.io "HTTP API", "Range vectors": `{"metric": {...}, "values":
    [[<unix ts>, "<value>"], ...]}`); a `vector` is read too (`"value": [ts, "v"]`).
    Series without a numeric `gpu` label are skipped. Raises `_BadResponse`."""
    if not isinstance(body, dict) or body.get("status") != "success":
        raise _BadResponse(f"status is not success: {_clip(body)}")
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
        raise _BadResponse(f"expected a matrix result: {_clip(data)}")
    result = data.get("result")
    if not isinstance(result, list):
        raise _BadResponse(f"result is not a list: {_clip(result)}")
    found: list[Reading] = []
    for series in result:
        try:
            labels: dict[str, str] = dict(series["metric"])
            points: list[Any] = series["values"] if "values" in series else [series["value"]]
            ts, raw = max(points, key=lambda point: float(point[0]))
            metric, gpu = labels.get("__name__", ""), labels.get("gpu", "")
            if metric not in METRICS or not gpu.isdigit():
                continue
            found.append(
                Reading(metric, int(gpu), labels.get("UUID", ""), labels, float(raw), float(ts))
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise _BadResponse(f"malformed series {_clip(series)}: {exc!r}") from None
    return found


def gpus_from(found: Iterable[Reading]) -> tuple[list[GpuStats], float | None, str | None]:
    """The GPUs the readings describe (sorted by index), the timestamp of the oldest FB
    reading used (the snapshot's time; None without any), and the driver version.

    Raises `ProbeError` when one GPU index has series of several UUIDs (the selector
    matches several hosts) or MIG instances."""
    gpus: dict[int, _Gpu] = {}
    driver: str | None = None
    for reading in found:
        if reading.labels.get("GPU_I_ID"):
            raise ProbeError(
                f"GPU {reading.gpu} ({reading.uuid}) reports MIG instances (GPU_I_ID "
                f"{reading.labels['GPU_I_ID']}); the prometheus probe reads whole GPUs only",
                reason="unsupported",
            )
        gpu = gpus.setdefault(reading.gpu, _Gpu(reading.gpu, reading.uuid, reading.labels))
        if reading.uuid != gpu.uuid:
            raise ProbeError(
                f"the selector matches more than one GPU {reading.gpu} (UUIDs {gpu.uuid or '?'} "
                f"on {_where(gpu.labels)} and {reading.uuid or '?'} on {_where(reading.labels)}): "
                'narrow gpu.prometheus.selector to one host, e.g. {Hostname="node-c"}',
                reason="ambiguous",
            )
        seen = gpu.values.get(reading.metric)
        if seen is None or reading.ts > seen.ts:  # the same GPU scraped twice: the newest
            gpu.values[reading.metric] = reading
            if reading.ts >= max((r.ts for r in gpu.values.values()), default=0.0):
                gpu.labels = reading.labels
        driver = driver or reading.labels.get(DRIVER_LABEL) or None
    stats = [_stats(gpus[index]) for index in sorted(gpus)]
    times = [r.ts for g in gpus.values() for m, r in g.values.items() if m in (FB_USED, FB_FREE)]
    return stats, (min(times) if times else None), driver


def _stats(gpu: _Gpu) -> GpuStats:
    def value(metric: str) -> float | None:
        reading = gpu.values.get(metric)
        ok = reading is not None and math.isfinite(reading.value) and reading.value >= 0
        return reading.value if ok and reading is not None else None

    name = gpu.labels.get("modelName", "")
    used, free, reserved = value(FB_USED), value(FB_FREE), value(FB_RESERVED)
    if used is None or free is None:
        missing = [m for m, v in ((FB_USED, used), (FB_FREE, free)) if v is None]
        why = ", ".join(
            f"{m} is {gpu.values[m].value}" if m in gpu.values else f"{m} is missing"
            for m in missing
        )
        return GpuStats(
            gpu.index, gpu.uuid, name, 0, 0, 0, lost=True, error=f"GPU {gpu.index}: {why}"
        )
    reserved_bytes = None if reserved is None else round(reserved * MIB)
    used_bytes = round(used * MIB) + (reserved_bytes or 0)
    free_bytes = round(free * MIB)
    return GpuStats(
        index=gpu.index,
        uuid=gpu.uuid,
        name=name,
        total_bytes=used_bytes + free_bytes,
        used_bytes=used_bytes,
        free_bytes=free_bytes,
        reserved_bytes=reserved_bytes,
        utilization_gpu_pct=value(GPU_UTIL),
        utilization_memory_pct=value(MEM_COPY_UTIL),
        temperature_c=value(GPU_TEMP),
        power_w=value(POWER_USAGE),
    )


def _where(labels: Mapping[str, str]) -> str:
    return labels.get("Hostname") or labels.get("instance") or "?"


def _clip(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class PrometheusSource:
    """A `GpuSource` over Prometheus's query API. `transport` replaces httpx's (tests)."""

    name = "prometheus"

    def __init__(
        self,
        config: PrometheusProbeConfig,
        *,
        transport: AsyncBaseTransport | None = None,
        key: str = "gpu.prometheus",
    ) -> None:
        self._config = config
        self._key = key  # where it is configured (hosts.node-c.gpu.prometheus), for hints
        self._endpoint = f"{config.url}/api/v1/query"
        self._query = build_query(config.selector, config.lookback_s)
        self._client = async_client(
            transport=transport,
            timeout=Timeout(config.timeout_s),
            headers={"accept": "application/json", **config.headers},
        )
        self._lock = asyncio.Lock()  # one query at a time; concurrent callers share it
        self._last_at: float | None = None  # monotonic time of the last query
        self._last: GpuSnapshot | ProbeError | None = None

    @property
    def query(self) -> str:
        return self._query

    async def sample(self) -> GpuSnapshot:
        async with self._lock:
            now = time.monotonic()
            last = self._last
            if (
                last is None
                or self._last_at is None
                or now - self._last_at >= self._config.query_interval_s
            ):
                try:
                    last = await self._sample()
                except ProbeError as exc:
                    last = exc
                self._last, self._last_at = last, time.monotonic()
        if isinstance(last, ProbeError):  # a new exception: no traceback piles up on it
            raise ProbeError(str(last), reason=last.reason)
        return last

    async def close(self) -> None:
        await self._client.aclose()

    async def instant(self, promql: str) -> object:
        """The body of one instant query `promql` (another reader of the same Prometheus
        with the same URL, headers and token: `app.gpu.host_ram`). Raises `ProbeError`."""
        return await self._get(promql)

    @property
    def lookback_s(self) -> int:
        return self._config.lookback_s

    @property
    def query_interval_s(self) -> float:
        return self._config.query_interval_s

    @property
    def url(self) -> str:
        return self._config.url

    async def _sample(self) -> GpuSnapshot:
        body = await self._get(self._query)
        try:
            found = readings(body)
        except _BadResponse as exc:
            raise self._error(f"answered an unexpected body: {exc}", "bad_response") from None
        try:
            gpus, oldest, driver = gpus_from(found)
        except ProbeError as exc:
            raise ProbeError(
                f"Prometheus at {self._config.url}: {exc}", reason=exc.reason
            ) from None
        if not gpus or oldest is None:
            raise self._error(
                f"has no {FB_USED}/{FB_FREE} sample for {self._config.selector or 'any host'} "
                f"in the last {self._config.lookback_s} s (is dcgm-exporter scraped, and does "
                f"{self._key}.selector match its labels?)",
                "no_data",
            )
        wall, mono = time.time(), time.monotonic()
        age = max(0.0, wall - oldest)  # Prometheus's clock ahead of ours: age 0
        return GpuSnapshot(
            source=self.name,
            gpus=tuple(gpus),
            taken_at=mono - age,
            taken_at_wall=min(oldest, wall),
            driver_version=driver,
            extra={"url": self._config.url, "selector": self._config.selector},
        )

    async def _get(self, query: str) -> object:
        headers = {}
        token_env = self._config.bearer_token_env
        if token_env is not None:
            token = os.environ.get(token_env)
            if not token:
                raise self._error(
                    f"needs a bearer token, but {token_env} ({self._key}.bearer_token_env) "
                    "is unset or empty",
                    "no_permission",
                )
            headers["authorization"] = f"Bearer {token}"
        try:
            response = await self._client.get(
                self._endpoint, params={"query": query}, headers=headers
            )
        except TimeoutException:
            raise self._error(
                f"did not answer within {self._config.timeout_s:g} s", "timeout"
            ) from None
        except HTTPError as exc:
            raise self._error(
                f"is unreachable ({type(exc).__name__}: {_describe(exc)})", "unreachable"
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200:
            raise self._status_error(response.status_code, body, response.text)
        if body is None:
            raise self._error(
                f"answered 200 with a body that is not JSON: {_clip(response.text)}", "bad_response"
            )
        return body

    def _status_error(self, status: int, body: object, text: str) -> ProbeError:
        # The documented error envelope (prometheus.io "HTTP API", "Format overview"):
        # {"status": "error", "errorType": "...", "error": "..."}; 400 bad parameters,
        # 422 cannot execute, 503 timed out or aborted. Anything before the API (a proxy)
        # may answer something else.
        if isinstance(body, dict) and body.get("status") == "error":
            detail = f"{body.get('errorType', '?')}: {body.get('error', '')}"
        else:
            detail = _clip(text.strip() or "(empty body)")
        if status in (401, 403):
            hint = (
                "check the token in " + self._config.bearer_token_env
                if self._config.bearer_token_env
                else f"set {self._key}.bearer_token_env to the variable holding a token"
            )
            return self._error(f"refused the query ({status}: {detail}): {hint}", "no_permission")
        return self._error(f"answered {status}: {detail}", "bad_response")

    def _error(self, what: str, reason: str) -> ProbeError:
        return ProbeError(f"Prometheus at {self._config.url} {what}", reason=reason)


def _describe(exc: HTTPError) -> str:
    cause = exc.__cause__ or exc.__context__
    text = str(exc) or type(exc).__name__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({cause})"
    return text

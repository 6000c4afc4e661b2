"""A host's RAM: its total and what is available, for the budget of level-1 sleepers.

- The gateway's own machine: `/proc/meminfo` (`MemTotal`, `MemAvailable`, in kB, which the
  kernel means as KiB: proc(5)). MemAvailable is the kernel's estimate of what can be
  allocated without swapping (page cache that can be dropped counts as available; pinned
  memory does not).
- `host_ram.sim` (tests, demos): a fixed reading, `FixedRamSource`.
- Another host: node-exporter's `node_memory_MemTotal_bytes` and
  `node_memory_MemAvailable_bytes` (its meminfo collector, the same two fields in bytes),
  read through the Prometheus of that host's GPU probe (`PrometheusSource.instant`, same
  URL, headers and token) with the host's `host_ram.selector`, as a range query so each
  sample keeps its own timestamp (see `app.gpu.prometheus`).

`HostRamMonitor` keeps the last good reading and the probe's health, as `GpuMonitor` does
(both are `app.gpu.probe_monitor.ProbeMonitor`): `read()` takes a fresh one (a release
decision), `reading` is the last (`/status`, the metrics). Sources raise `ProbeError` only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from app.gpu.probe_monitor import ProbeMonitor
from app.gpu.prometheus import PrometheusSource
from app.gpu.telemetry import ProbeError

logger = logging.getLogger(__name__)

KIB: Final = 1024
MEMINFO: Final = Path("/proc/meminfo")
MEM_TOTAL: Final = "node_memory_MemTotal_bytes"
MEM_AVAILABLE: Final = "node_memory_MemAvailable_bytes"


@dataclass(frozen=True, slots=True)
class RamReading:
    total_bytes: int
    available_bytes: int
    taken_at: float  # monotonic

    @property
    def total_mib(self) -> int:
        return self.total_bytes // (KIB * KIB)

    @property
    def available_mib(self) -> int:
        return self.available_bytes // (KIB * KIB)  # rounded down: never overstated


class RamSource(Protocol):
    name: str

    async def sample(self) -> RamReading: ...


def parse_meminfo(text: str, *, now: float | None = None) -> RamReading:
    """MemTotal and MemAvailable of a /proc/meminfo text. Raises `ProbeError`."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            unit = parts[1] if len(parts) > 1 else ""
            fields[key] = int(parts[0]) * (KIB if unit == "kB" else 1)
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in fields]
    if missing:
        # MemAvailable exists since Linux 3.14.
        raise ProbeError(f"/proc/meminfo has no {' or '.join(missing)}", reason="bad_response")
    return RamReading(
        fields["MemTotal"], fields["MemAvailable"], time.monotonic() if now is None else now
    )


class MeminfoSource:
    """The gateway's own machine. A procfs read is served from kernel memory (no disk)."""

    name = "meminfo"

    def __init__(self, path: Path = MEMINFO) -> None:
        self._path = path

    async def sample(self) -> RamReading:
        try:
            text = self._path.read_text(encoding="ascii", errors="replace")
        except OSError as exc:
            raise ProbeError(f"cannot read {self._path}: {exc}", reason="error") from None
        return parse_meminfo(text)


class FixedRamSource:
    """A fixed reading: `host_ram.sim` (tests, demos) and the in-process tests' seam. Its
    numbers change only when set (`total_mib`, `available_mib`)."""

    name = "sim"

    def __init__(self, total_mib: int, available_mib: int) -> None:
        self.total_mib = total_mib
        self.available_mib = available_mib

    async def sample(self) -> RamReading:
        mib = KIB * KIB
        return RamReading(self.total_mib * mib, self.available_mib * mib, time.monotonic())


def build_ram_query(selector: str, lookback_s: int) -> str:
    """`{__name__=~"node_memory_MemTotal_bytes|...",<selector>}[<lookback>s]`."""
    names = f'__name__=~"{MEM_TOTAL}|{MEM_AVAILABLE}"'
    inner = selector.strip()[1:-1].strip().rstrip(",").strip() if selector.strip() else ""
    matchers = f"{names},{inner}" if inner else names
    return f"{{{matchers}}}[{lookback_s}s]"


def node_memory(body: object, *, wall: float, mono: float) -> RamReading:
    """The newest MemTotal and MemAvailable of a `/api/v1/query` answer (matrix or
    vector). Raises `ProbeError` when one is missing or several hosts answer."""
    result = body.get("data", {}).get("result") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or body.get("status") != "success"
        or not isinstance(result, list)
    ):
        raise ProbeError("answered an unexpected body", reason="bad_response")
    try:
        newest: dict[str, tuple[float, float]] = {}
        instances: dict[str, str] = {}
        for series in result:
            labels = series["metric"]
            name = labels.get("__name__", "")
            points = series["values"] if "values" in series else [series["value"]]
            ts, raw = max(points, key=lambda point: float(point[0]))
            where = labels.get("instance", "?")
            if instances.setdefault(name, where) != where:
                raise ProbeError(
                    f"{name} comes from several hosts ({instances[name]} and {where}): narrow "
                    'host_ram.selector to one node-exporter, e.g. {instance="node-c:9100"}',
                    reason="ambiguous",
                )
            if name in (MEM_TOTAL, MEM_AVAILABLE):
                newest[name] = max(newest.get(name, (0.0, 0.0)), (float(ts), float(raw)))
    except (AttributeError, KeyError, TypeError, ValueError, IndexError):
        raise ProbeError("answered an unexpected body", reason="bad_response") from None
    missing = [m for m in (MEM_TOTAL, MEM_AVAILABLE) if m not in newest]
    if missing:
        raise ProbeError(
            f"has no {' or '.join(missing)} sample (is node-exporter scraped, and does "
            "host_ram.selector match its labels?)",
            reason="no_data",
        )
    oldest = min(ts for ts, _ in newest.values())
    return RamReading(
        round(newest[MEM_TOTAL][1]),
        round(newest[MEM_AVAILABLE][1]),
        mono - max(0.0, wall - oldest),
    )


class NodeExporterSource:
    """Another host's RAM, from node-exporter series in the Prometheus of its GPU probe."""

    name = "prometheus"

    def __init__(
        self, prometheus: PrometheusSource, selector: str, *, min_interval_s: float = 0.0
    ) -> None:
        self._prometheus = prometheus
        self.query = build_ram_query(selector, prometheus.lookback_s)
        # At most one query this often (the GPU probe's query_interval_s): Prometheus has
        # nothing newer than its last scrape, and release decisions ask at every release.
        self._min_interval_s = min_interval_s
        self._last: tuple[float, RamReading] | None = None

    async def sample(self) -> RamReading:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self._min_interval_s:
            return self._last[1]
        body = await self._prometheus.instant(self.query)
        try:
            reading = node_memory(body, wall=time.time(), mono=time.monotonic())
        except ProbeError as exc:
            raise ProbeError(
                f"Prometheus at {self._prometheus.url} {exc}", reason=exc.reason
            ) from None
        self._last = (now, reading)
        return reading


class HostRamMonitor(ProbeMonitor[RamReading]):
    """The last good RAM reading of a host and the health of its source."""

    kind = "host ram"
    logger = logger

    def __init__(self, source: RamSource, *, host: str, poll_interval_s: float) -> None:
        super().__init__(source, poll_interval_s=poll_interval_s, host=host)

    @property
    def reading(self) -> RamReading | None:
        """The last good reading."""
        return self.last

    def describe(self, sample: RamReading) -> str:
        return f"total_mib={sample.total_mib} available_mib={sample.available_mib}"

"""`gpu.probe: auto` (the default): NVML when it loads and sees a GPU, else no probe.

`detect_nvml` asks NVML once, at start (and `check-config`): the module `pynvml` imports,
`nvmlInit()` works and `nvmlDeviceGetCount()` is at least 1. Then the probe is `nvml`.
Otherwise the gateway runs with no probe (`none`: no GPU telemetry, VRAM admission off)
and says why, loudly: a WARNING at start, `gpu.warning` in `/status`, a banner on the
control page, a warning from `check-config`. It never falls back to a simulated GPU:
that is `probe: sim`, said in the config (the demo's).

The calls block (NVML can hang in `nvmlInit`), so they run on a daemon thread awaited
with a timeout; a hung driver is reported as such. Another host (`hosts:`) is never
probed with NVML (it reads this machine): `auto` there is `none`, with a warning.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from app.gpu.nvml import NvmlApi
from app.settings.base import LOCAL_HOST

if TYPE_CHECKING:
    from app.settings import Settings

FIX: str = (
    "set gpu: {probe: nvml} to insist on the real GPUs (the gateway then reports the "
    "probe down until NVML works), probe: sim for a simulated GPU (a demo), or probe: none "
    "to run without admission and without this warning"
)


@dataclass(frozen=True, slots=True)
class AutoProbe:
    """What `auto` resolved to: `nvml`, or `none` with the warning saying why."""

    probe: Literal["nvml", "none"]
    warning: str | None


def _import_pynvml() -> NvmlApi:
    import pynvml

    return cast(NvmlApi, pynvml)


def _ask(load: Callable[[], NvmlApi]) -> AutoProbe:
    """Blocking: load NVML, initialize it, count the GPUs."""
    try:
        api = load()
    except ImportError:
        return none("the nvidia-ml-py package (module pynvml) is not installed")
    try:
        api.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return none(f"NVML did not load: {exc}")
    try:
        count = api.nvmlDeviceGetCount()
    except Exception as exc:
        return none(f"NVML sees no GPU: nvmlDeviceGetCount failed: {exc}")
    finally:
        # The answer is known: a failed shutdown changes nothing.
        with contextlib.suppress(Exception):
            api.nvmlShutdown()
    if count < 1:
        return none("NVML loaded but sees no GPU")
    return AutoProbe("nvml", None)


def none(why: str) -> AutoProbe:
    return AutoProbe(
        "none",
        f"gpu.probe is auto and {why}: no GPU probe, VRAM admission is off (every start "
        f"is allowed); {FIX}",
    )


def detect_nvml(*, timeout_s: float, nvml: object | None = None) -> AutoProbe:
    """`auto` on the gateway's own machine. `nvml` replaces the `pynvml` module (tests)."""

    def load() -> NvmlApi:
        return cast(NvmlApi, nvml) if nvml is not None else _import_pynvml()

    future: concurrent.futures.Future[AutoProbe] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(_ask(load))
        except BaseException as exc:  # handed to the waiting side
            future.set_exception(exc)

    # A daemon thread, not an executor: a call hung in the driver must not hang the exit.
    threading.Thread(target=run, name="nvml-auto", daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return none(f"NVML did not answer within {timeout_s:g} s (a hung driver)")


def auto_probes(settings: Settings, *, nvml: object | None = None) -> dict[str, AutoProbe]:
    """What `auto` is on each host that has it (blocking: call it off the event loop)."""
    found: dict[str, AutoProbe] = {}
    if settings.gpu.probe == "auto":
        found[LOCAL_HOST] = detect_nvml(timeout_s=settings.gpu.sample_timeout_s, nvml=nvml)
    for name, host in settings.hosts.items():
        if host.gpu.probe == "auto":
            found[name] = AutoProbe("none", REMOTE_WARNING)
    return found


def probe_warnings(settings: Settings, *, nvml: object | None = None) -> list[str]:
    """What `check-config` says about `auto` (each `gpu.probe: ...` or
    `hosts.NAME.gpu.probe: ...`): asks NVML as the gateway would at start."""
    return [
        f"{'gpu' if host == LOCAL_HOST else f'hosts.{host}.gpu'}.probe: {found.warning}"
        for host, found in auto_probes(settings, nvml=nvml).items()
        if found.warning is not None
    ]


REMOTE_WARNING: str = (
    "gpu.probe is auto on another host: NVML reads only the gateway's own machine, so "
    "this host has no GPU probe and VRAM admission is off there; set probe: prometheus "
    "(dcgm-exporter on that host), sim, or none"
)

"""NvmlSource: the real GPUs through NVIDIA's NVML (nvidia-ml-py, module `pynvml`).

NVML calls are blocking ctypes calls into the driver, and they can hang (a GPU without
persistence mode pays a full init per call; some drivers hang in `nvmlInit`). So:

- one sample (every GPU) is one job on one dedicated worker thread, awaited with a
  timeout; the event loop never waits on the driver;
- while a job is blocked past its timeout, `sample()` fails at once (reason `timeout`)
  instead of queuing more work behind the hung call; the first sample after the call
  returns works again;
- the worker is a daemon thread rather than a `ThreadPoolExecutor` worker: the
  interpreter joins executor threads at exit, so a call hung in the driver would hang
  the gateway's shutdown.

`nvmlInit()` runs once, on the first sample (again on a later sample if it failed, so a
driver or device that appears later is picked up); `close()` calls `nvmlShutdown()`.

Errors: a failure of the whole sample (library missing, driver not loaded, no
permission) raises `ProbeError` with a message a user can act on. A GPU that fell off
the bus (or cannot be read) is reported `lost=True` with its last seen numbers, and the
other GPUs are still sampled. A field the GPU does not support is `None`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Final, Protocol, TypeVar, cast

from app.gpu.telemetry import GpuProcess, GpuSnapshot, GpuStats, ProbeError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# NVML return codes (nvml.h). pynvml generates one `NVMLError_*` subclass per code
# (`NVMLError(code)` builds the subclass), so the code identifies the class.
_UNINITIALIZED: Final = 1
_NOT_SUPPORTED: Final = 3
_NO_PERMISSION: Final = 4
_DRIVER_NOT_LOADED: Final = 9
_LIBRARY_NOT_FOUND: Final = 12
_FUNCTION_NOT_FOUND: Final = 13
_GPU_IS_LOST: Final = 15
_RESET_REQUIRED: Final = 16
_LIB_RM_VERSION_MISMATCH: Final = 18
_DEPRECATED: Final = 26

# Codes that mean NVML as a whole is unusable: the sample fails (rather than one GPU).
_GLOBAL_CODES: Final = frozenset(
    {
        _UNINITIALIZED,
        _NO_PERMISSION,
        _DRIVER_NOT_LOADED,
        _LIBRARY_NOT_FOUND,
        _LIB_RM_VERSION_MISMATCH,
    }
)
# After these, initialize again on the next sample (the driver may come back).
_REINIT_CODES: Final = frozenset({_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIB_RM_VERSION_MISMATCH})

LIBRARY_NOT_FOUND_HINT: Final = (
    "run the container with the NVIDIA runtime and the utility capability (compose "
    "`gpus: all`, or NVIDIA_DRIVER_CAPABILITIES including utility), or set gpu.probe to "
    "sim or none"
)


# -- the slice of pynvml this module uses (the test seam) -----------------------------


class _Memory(Protocol):
    @property
    def total(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def free(self) -> int: ...


class _MemoryV2(_Memory, Protocol):
    @property
    def reserved(self) -> int: ...


class _Utilization(Protocol):
    @property
    def gpu(self) -> int: ...
    @property
    def memory(self) -> int: ...


class _Process(Protocol):
    @property
    def pid(self) -> int: ...
    @property
    def usedGpuMemory(self) -> int | None: ...  # pynvml's name


class NvmlApi(Protocol):
    """The functions and names of `pynvml` that `NvmlSource` calls. The real module
    matches it; tests pass a typed fake."""

    NVMLError: type[Exception]
    NVMLLibraryMismatchError: type[Exception]
    NVML_TEMPERATURE_GPU: int
    nvmlMemory_v2: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...


# -- the worker thread ------------------------------------------------------------------


class _Worker:
    """One daemon thread that runs submitted calls in order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((fn, future))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return future

    def shutdown(self) -> None:
        """Ask the thread to exit after its current call; never waits for it."""
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting side
                future.set_exception(exc)
            else:
                future.set_result(result)


def _consume(future: asyncio.Future[Any]) -> None:
    # A waiter that timed out leaves its future behind: retrieve the outcome so asyncio
    # does not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


# -- errors -----------------------------------------------------------------------------


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _describe(exc: BaseException) -> str:
    code = _code(exc)
    return f"{exc} (NVML error {code})" if code is not None else repr(exc)


def _probe_error(exc: BaseException, call: str) -> ProbeError:
    """The ProbeError for a failure of NVML as a whole, with what to do about it."""
    code = _code(exc)
    if code == _LIBRARY_NOT_FOUND:
        return ProbeError(
            f"libnvidia-ml.so.1 not found: {LIBRARY_NOT_FOUND_HINT}", reason="library_not_found"
        )
    if code == _DRIVER_NOT_LOADED:
        return ProbeError(
            f"the NVIDIA driver is not loaded ({call}: {exc}): no GPU was passed into the "
            "container or the host has no working driver; check `nvidia-smi` on the host "
            "and give the container the GPU (compose `gpus: all`)",
            reason="driver_not_loaded",
        )
    if code == _NO_PERMISSION:
        return ProbeError(
            f"no permission to query the GPU ({call}: {exc}): this process cannot open "
            "/dev/nvidiactl or /dev/nvidia*; run the container with the NVIDIA runtime or "
            "give this user access to the device files",
            reason="no_permission",
        )
    if code == _LIB_RM_VERSION_MISMATCH:
        return ProbeError(
            f"the NVIDIA driver was upgraded without a reboot ({call}: {exc}): reboot the "
            "host or reload the nvidia kernel modules",
            reason="error",
        )
    if code == _UNINITIALIZED:
        return ProbeError(
            f"NVML is not initialized ({call}: {exc}); it is initialized again on the next sample",
            reason="error",
        )
    return ProbeError(f"NVML call {call} failed: {_describe(exc)}", reason="error")


def _gpu_error(index: int, exc: BaseException, call: str) -> str:
    code = _code(exc)
    if code == _GPU_IS_LOST:
        return (
            f"GPU {index} is lost ({call}: {exc}): it fell off the bus; nothing is scheduled "
            "on it until it answers again (check `dmesg` for Xid errors; a GPU reset or "
            "a reboot is usually needed)"
        )
    if code == _RESET_REQUIRED:
        return f"GPU {index} needs a reset ({call}: {exc}): run `nvidia-smi -r` or reboot"
    return f"GPU {index} cannot be read: {call} failed: {_describe(exc)}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# -- the source ----------------------------------------------------------------------


class NvmlSource:
    """A `GpuSource` over NVML. `nvml` replaces the `pynvml` module (tests); None
    imports it on the first sample."""

    name = "nvml"

    def __init__(self, *, timeout_s: float, nvml: object | None = None) -> None:
        self._timeout_s = timeout_s
        self._api: NvmlApi | None = cast(NvmlApi, nvml) if nvml is not None else None
        self._worker = _Worker("nvml")
        self._closed = False
        # The current job (one sample) and when it was submitted (monotonic).
        self._job: concurrent.futures.Future[GpuSnapshot] | None = None
        self._job_started = 0.0
        # Written by the worker thread only; read by the loop for messages.
        self._call = "nothing"
        self._initialized = False
        self._driver_version: str | None = None
        self._last_seen: dict[int, GpuStats] = {}

    def blocked_s(self) -> float | None:
        """How long the current NVML job has been running, None when idle."""
        job = self._job
        if job is None or job.done():
            return None
        return time.monotonic() - self._job_started

    async def sample(self) -> GpuSnapshot:
        if self._closed:
            raise ProbeError("the NVML source is closed", reason="error")
        blocked = self.blocked_s()
        if blocked is not None and self._job is not None:
            if blocked >= self._timeout_s:
                raise ProbeError(
                    f"NVML has been blocked for {blocked:.1f} s in {self._call}; no other "
                    "call is queued until it returns (a driver stuck like this often means "
                    "persistence mode is off, `nvidia-smi -pm 1`, or the GPU is failing)",
                    reason="timeout",
                )
            # A sample is under way (another caller): share it, within the same deadline.
            return await self._wait(self._job, self._timeout_s - blocked)
        self._job_started = time.monotonic()
        self._job = self._worker.submit(self._sample_blocking)
        return await self._wait(self._job, self._timeout_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        blocked = self.blocked_s()
        if blocked is None or blocked < self._timeout_s:  # idle, or a sample finishing
            job = self._worker.submit(self._shutdown_blocking)
            try:
                await self._wait(job, self._timeout_s)
            except ProbeError as exc:
                logger.warning("nvml shutdown failed error=%s", exc)
        else:
            logger.warning(
                "nvml close without nvmlShutdown: blocked_s=%.1f call=%s", blocked, self._call
            )
        self._worker.shutdown()

    async def _wait(self, job: concurrent.futures.Future[T], timeout_s: float) -> T:
        waiter = asyncio.wrap_future(job)
        waiter.add_done_callback(_consume)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            raise ProbeError(
                f"NVML did not answer within {self._timeout_s:g} s (blocked in "
                f"{self._call}); a driver this slow often means persistence mode is off "
                "(`nvidia-smi -pm 1`) or the GPU is failing",
                reason="timeout",
            ) from None
        except ProbeError:
            raise
        except Exception as exc:  # not raised by the worker's own code: a safety net
            raise ProbeError(f"NVML sample failed: {exc!r}") from exc

    # -- on the worker thread -----------------------------------------------------------

    def _do(self, call: str, fn: Callable[..., T], *args: Any) -> T:
        self._call = call
        return fn(*args)

    def _load_api(self) -> NvmlApi:
        if self._api is None:
            try:
                import pynvml
            except ImportError as exc:
                raise ProbeError(
                    "the nvidia-ml-py package (module pynvml) is not installed: "
                    "`pip install nvidia-ml-py`, or set gpu.probe to sim or none",
                    reason="library_not_found",
                ) from exc
            self._api = cast(NvmlApi, pynvml)
        return self._api

    def _sample_blocking(self) -> GpuSnapshot:
        api = self._load_api()
        try:
            if not self._initialized:
                self._do("nvmlInit", api.nvmlInit)
                self._initialized = True
                logger.info("nvml initialized")
            if self._driver_version is None:
                try:
                    version = self._do("nvmlSystemGetDriverVersion", api.nvmlSystemGetDriverVersion)
                    self._driver_version = _text(version)
                except api.NVMLError as exc:
                    if _code(exc) in _GLOBAL_CODES:
                        raise
            count = self._do("nvmlDeviceGetCount", api.nvmlDeviceGetCount)
            gpus = tuple(self._read_gpu(api, index) for index in range(count))
        except api.NVMLError as exc:
            if _code(exc) in _REINIT_CODES:
                self._initialized = False
                self._driver_version = None
            raise _probe_error(exc, self._call) from None
        except ProbeError:
            raise
        except Exception as exc:  # e.g. NVMLLibraryMismatchError, a ctypes error
            raise ProbeError(f"NVML call {self._call} failed: {exc!r}") from exc
        finally:
            self._call = "nothing"
        return GpuSnapshot(
            source=self.name,
            gpus=gpus,
            taken_at=time.monotonic(),
            taken_at_wall=time.time(),
            driver_version=self._driver_version,
        )

    def _read_gpu(self, api: NvmlApi, index: int) -> GpuStats:
        try:
            stats = self._read_gpu_fields(api, index)
        except api.NVMLError as exc:
            if _code(exc) in _GLOBAL_CODES:
                raise
            last = self._last_seen.get(index)
            if last is None:
                last = GpuStats(index, "", "", 0, 0, 0)
            return replace(last, lost=True, error=_gpu_error(index, exc, self._call))
        self._last_seen[index] = stats
        return stats

    def _read_gpu_fields(self, api: NvmlApi, index: int) -> GpuStats:
        gpu = f"(GPU {index})"
        handle = self._do(
            f"nvmlDeviceGetHandleByIndex {gpu}", api.nvmlDeviceGetHandleByIndex, index
        )
        name = _text(self._do(f"nvmlDeviceGetName {gpu}", api.nvmlDeviceGetName, handle))
        uuid = _text(self._do(f"nvmlDeviceGetUUID {gpu}", api.nvmlDeviceGetUUID, handle))
        memory: _Memory = self._do(
            f"nvmlDeviceGetMemoryInfo {gpu}", api.nvmlDeviceGetMemoryInfo, handle
        )

        def reserved() -> int:
            v2: _MemoryV2 = api.nvmlDeviceGetMemoryInfo(handle, version=api.nvmlMemory_v2)
            return int(v2.reserved)

        def utilization() -> tuple[float, float]:
            rates: _Utilization = api.nvmlDeviceGetUtilizationRates(handle)
            return float(rates.gpu), float(rates.memory)

        def processes() -> tuple[GpuProcess, ...]:
            found: Sequence[_Process] = api.nvmlDeviceGetComputeRunningProcesses(handle)
            return tuple(GpuProcess(int(p.pid), p.usedGpuMemory) for p in found)

        util = self._optional(api, f"nvmlDeviceGetUtilizationRates {gpu}", utilization)
        temperature = self._optional(
            api,
            f"nvmlDeviceGetTemperature {gpu}",
            lambda: api.nvmlDeviceGetTemperature(handle, api.NVML_TEMPERATURE_GPU),
        )
        power_mw = self._optional(
            api, f"nvmlDeviceGetPowerUsage {gpu}", lambda: api.nvmlDeviceGetPowerUsage(handle)
        )
        return GpuStats(
            index=index,
            uuid=uuid,
            name=name,
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            free_bytes=int(memory.free),
            reserved_bytes=self._optional(api, f"nvmlDeviceGetMemoryInfo_v2 {gpu}", reserved),
            utilization_gpu_pct=None if util is None else util[0],
            utilization_memory_pct=None if util is None else util[1],
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
            processes=self._optional(api, f"nvmlDeviceGetComputeRunningProcesses {gpu}", processes)
            or (),
        )

    def _optional(self, api: NvmlApi, call: str, fn: Callable[[], T]) -> T | None:
        """A field the GPU may not offer: None when NVML says so (NotSupported, removed,
        too old a driver), or on any other error of this one call. A lost GPU or a dead
        driver still propagates."""
        try:
            return self._do(call, fn)
        except api.NVMLLibraryMismatchError:
            return None
        except api.NVMLError as exc:
            code = _code(exc)
            if code in _GLOBAL_CODES or code in (_GPU_IS_LOST, _RESET_REQUIRED):
                raise
            if code not in (_NOT_SUPPORTED, _DEPRECATED, _FUNCTION_NOT_FOUND):
                logger.debug("nvml field unavailable call=%s error=%s", call, exc)
            return None

    def _shutdown_blocking(self) -> None:
        if not self._initialized or self._api is None:
            return
        api = self._api
        try:
            self._do("nvmlShutdown", api.nvmlShutdown)
        except api.NVMLError as exc:
            raise _probe_error(exc, "nvmlShutdown") from None
        finally:
            self._initialized = False
            self._call = "nothing"

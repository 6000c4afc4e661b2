"""NvmlSource against a typed fake of the pynvml module (real pynvml exception classes,
gates for hung calls), and against the real pynvml on this machine, which has no NVIDIA
library: the failure a user sees when the container lacks the NVIDIA runtime."""

from __future__ import annotations

import asyncio
import ctypes.util
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.api.views import gpu_status_view
from app.gpu.collector import GpuCollector
from app.gpu.nvml import NvmlApi, NvmlSource
from app.gpu.poller import GpuMonitor
from app.gpu.telemetry import MIB, ProbeError
from tests.fakes.waits import until

GIB = 1024 * MIB
TIMEOUT_S = 0.3  # a hung call is detected after this
GATE_LIMIT_S = 10.0  # a gate nobody releases still lets the worker thread go


@dataclass(frozen=True)
class Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class MemoryV2:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass(frozen=True)
class Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True)
class Process:
    pid: int
    usedGpuMemory: int | None  # pynvml's name


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 4090"
    uuid: str = "GPU-5d3c1a2b-0000-1111-2222-333344445555"
    total: int = 24 * GIB
    used: int = 10 * GIB  # v1: includes reserved
    reserved: int = 500 * MIB
    util_gpu: int = 37
    util_memory: int = 12
    temperature: int = 54
    power_mw: int = 215_500
    processes: list[Process] = field(default_factory=list)
    # function name -> NVML error code it raises ("nvmlDeviceGetMemoryInfo_v2" for v2).
    fail: dict[str, int] = field(default_factory=dict)
    # function name -> gate it blocks on until released.
    hang: dict[str, threading.Event] = field(default_factory=dict)


class FakeNvml:
    """The slice of pynvml NvmlSource uses, with settable GPUs and failures."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, *gpus: FakeGpu) -> None:
        self.gpus = list(gpus)
        self.calls: list[str] = []
        self.init_error: int | None = None
        self.count_error: Exception | None = None  # raised as is by nvmlDeviceGetCount
        self.driver_version = "560.35.03"
        self.blocked = threading.Event()  # set when a call starts waiting on a gate

    def _enter(self, call: str, gpu: FakeGpu | None = None) -> None:
        self.calls.append(call)
        if gpu is None:
            return
        gate = gpu.hang.get(call)
        if gate is not None:
            self.blocked.set()
            gate.wait(GATE_LIMIT_S)
        code = gpu.fail.get(call)
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, handle: Any) -> FakeGpu:
        return self.gpus[int(handle)]

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        if self.count_error is not None:
            raise self.count_error
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", self.gpus[index])
        return index

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        self._enter("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        self._enter("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle)
        if version is None:
            self._enter("nvmlDeviceGetMemoryInfo", gpu)
            return Memory(gpu.total, gpu.total - gpu.used, gpu.used)
        assert version == pynvml.nvmlMemory_v2
        self._enter("nvmlDeviceGetMemoryInfo_v2", gpu)
        # v2 `used` excludes reserved: a different number, which must not be used.
        v2_used = gpu.used - gpu.reserved
        return MemoryV2(version, gpu.total, gpu.reserved, gpu.total - gpu.used, v2_used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        self._enter("nvmlDeviceGetUtilizationRates", gpu)
        return Utilization(gpu.util_gpu, gpu.util_memory)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._enter("nvmlDeviceGetTemperature", gpu)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        self._enter("nvmlDeviceGetPowerUsage", gpu)
        return gpu.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle)
        self._enter("nvmlDeviceGetComputeRunningProcesses", gpu)
        return list(gpu.processes)


def _conforms(fake: FakeNvml) -> NvmlApi:
    return fake  # mypy checks that the fake matches what NvmlSource calls


@pytest.fixture
async def make_source() -> AsyncIterator[Callable[[FakeNvml], NvmlSource]]:
    sources: list[NvmlSource] = []

    def make(fake: FakeNvml) -> NvmlSource:
        source = NvmlSource(timeout_s=TIMEOUT_S, nvml=_conforms(fake))
        sources.append(source)
        return source

    yield make
    for source in sources:
        await source.close()


async def _until_idle(source: NvmlSource) -> None:
    await until(lambda: source.blocked_s() is None, what="the NVML worker to finish its call")


async def test_reads_every_field_of_every_gpu(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    gpu0 = FakeGpu(processes=[Process(4242, 9 * GIB), Process(4343, None)])
    gpu1 = FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100", total=80 * GIB, used=GIB)
    source = make_source(FakeNvml(gpu0, gpu1))

    snapshot = await source.sample()

    assert source.name == "nvml"
    assert snapshot.source == "nvml"
    assert snapshot.driver_version == "560.35.03"
    first, second = snapshot.gpus
    assert (first.index, first.name, first.uuid) == (0, gpu0.name, gpu0.uuid)
    # v1 numbers (used includes reserved); reserved from v2.
    assert (first.total_bytes, first.used_bytes, first.free_bytes) == (24 * GIB, 10 * GIB, 14 * GIB)
    assert first.reserved_bytes == 500 * MIB
    assert (first.utilization_gpu_pct, first.utilization_memory_pct) == (37.0, 12.0)
    assert first.temperature_c == 54.0
    assert first.power_w == pytest.approx(215.5)
    assert [(p.pid, p.used_bytes) for p in first.processes] == [(4242, 9 * GIB), (4343, None)]
    assert not first.lost
    assert first.error is None
    assert (second.index, second.uuid, second.total_mib, second.used_mib) == (
        1,
        "GPU-a100",
        81920,
        1024,
    )
    assert second.processes == ()


async def test_unsupported_fields_are_none_and_the_sample_succeeds(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    not_supported = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = FakeGpu(
        fail={
            "nvmlDeviceGetPowerUsage": not_supported,
            "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_DEPRECATED,
            "nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            "nvmlDeviceGetUtilizationRates": not_supported,
            "nvmlDeviceGetComputeRunningProcesses": not_supported,
        }
    )
    source = make_source(FakeNvml(gpu, FakeGpu(uuid="GPU-other")))

    snapshot = await source.sample()

    stats = snapshot.gpus[0]
    assert stats.power_w is None
    assert stats.temperature_c is None
    assert stats.reserved_bytes is None
    assert stats.utilization_gpu_pct is None
    assert stats.utilization_memory_pct is None
    assert stats.processes == ()
    assert (stats.used_bytes, stats.lost, stats.error) == (10 * GIB, False, None)
    assert snapshot.gpus[1].power_w == pytest.approx(215.5)


async def test_a_lost_gpu_keeps_its_last_numbers_and_recovers(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    healthy = FakeGpu(uuid="GPU-healthy")
    flaky = FakeGpu(uuid="GPU-flaky", used=3 * GIB)
    source = make_source(FakeNvml(healthy, flaky))
    await source.sample()

    flaky.used = 7 * GIB  # never seen: the lost GPU must report the last seen 3 GiB
    flaky.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    lost = await source.sample()

    assert not lost.gpus[0].lost
    assert lost.gpus[0].error is None
    assert lost.gpus[1].lost
    assert lost.gpus[1].uuid == "GPU-flaky"
    assert lost.gpus[1].used_bytes == 3 * GIB
    assert lost.gpus[1].error is not None
    assert "GPU 1 is lost" in lost.gpus[1].error
    assert "nvmlDeviceGetMemoryInfo" in lost.gpus[1].error

    flaky.fail.clear()
    recovered = await source.sample()

    assert not recovered.gpus[1].lost
    assert recovered.gpus[1].error is None
    assert recovered.gpus[1].used_bytes == 7 * GIB


async def test_a_gpu_lost_before_it_was_ever_read_reports_zeros(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    broken = FakeGpu(fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST})
    source = make_source(FakeNvml(FakeGpu(), broken))

    snapshot = await source.sample()

    stats = snapshot.gpus[1]
    assert stats.lost
    assert (stats.total_bytes, stats.used_bytes, stats.free_bytes) == (0, 0, 0)
    assert not snapshot.gpus[0].lost


async def test_init_fails_then_the_driver_appears(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    fake = FakeNvml(FakeGpu())
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    source = make_source(fake)

    with pytest.raises(ProbeError) as caught:
        await source.sample()

    assert caught.value.reason == "driver_not_loaded"
    assert "NVIDIA driver is not loaded" in str(caught.value)
    assert "gpus: all" in str(caught.value)

    fake.init_error = None
    snapshot = await source.sample()

    assert len(snapshot.gpus) == 1
    assert fake.calls.count("nvmlInit") == 2
    await source.sample()
    assert fake.calls.count("nvmlInit") == 2  # once initialized, never again


@pytest.mark.parametrize(
    ("code", "reason", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library_not_found", "libnvidia-ml.so.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no_permission", "/dev/nvidia"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "error", "upgraded without a reboot"),
        (pynvml.NVML_ERROR_UNKNOWN, "error", "nvmlInit failed: Unknown Error (NVML error 999)"),
    ],
)
async def test_init_errors_map_to_reasons_and_advice(
    make_source: Callable[[FakeNvml], NvmlSource], code: int, reason: str, words: str
) -> None:
    fake = FakeNvml(FakeGpu())
    fake.init_error = code
    source = make_source(fake)

    with pytest.raises(ProbeError) as caught:
        await source.sample()

    assert caught.value.reason == reason
    assert words in str(caught.value)


async def test_a_dead_driver_mid_sample_fails_the_sample_not_one_gpu(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    gpu = FakeGpu()
    fake = FakeNvml(gpu)
    source = make_source(fake)
    await source.sample()
    gpu.fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    with pytest.raises(ProbeError) as caught:
        await source.sample()

    assert caught.value.reason == "driver_not_loaded"
    gpu.fail.clear()
    await source.sample()
    assert fake.calls.count("nvmlInit") == 2  # initialized again after the driver came back


async def test_a_non_nvml_exception_is_a_probe_error_naming_the_call(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    fake = FakeNvml(FakeGpu())
    fake.count_error = pynvml.NVMLLibraryMismatchError("driver too old")
    source = make_source(fake)

    with pytest.raises(ProbeError) as caught:
        await source.sample()

    assert caught.value.reason == "error"
    assert "NVML call nvmlDeviceGetCount failed" in str(caught.value)
    assert "driver too old" in str(caught.value)


async def test_a_hung_call_times_out_and_nothing_queues_behind_it(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    gate = threading.Event()
    gpu = FakeGpu(hang={"nvmlDeviceGetPowerUsage": gate})
    fake = FakeNvml(gpu)
    source = make_source(fake)
    try:
        started = time.monotonic()
        with pytest.raises(ProbeError) as first:
            await source.sample()
        assert time.monotonic() - started >= TIMEOUT_S
        assert first.value.reason == "timeout"
        assert "nvmlDeviceGetPowerUsage (GPU 0)" in str(first.value)
        calls = len(fake.calls)

        started = time.monotonic()
        with pytest.raises(ProbeError) as second:
            await source.sample()

        assert time.monotonic() - started < TIMEOUT_S / 2  # fails fast, does not wait
        assert second.value.reason == "timeout"
        assert "NVML has been blocked for" in str(second.value)
        assert "nvmlDeviceGetPowerUsage" in str(second.value)
        assert len(fake.calls) == calls  # nothing new was called or queued
    finally:
        gate.set()
    await _until_idle(source)

    gpu.hang.clear()
    snapshot = await source.sample()

    assert snapshot.gpus[0].power_w == pytest.approx(215.5)
    assert fake.calls.count("nvmlInit") == 1


async def test_concurrent_samples_share_one_call(
    make_source: Callable[[FakeNvml], NvmlSource],
) -> None:
    gate = threading.Event()
    fake = FakeNvml(FakeGpu(hang={"nvmlDeviceGetName": gate}))
    source = make_source(fake)
    try:
        first = asyncio.create_task(source.sample())
        assert await asyncio.to_thread(fake.blocked.wait, 5)
        second = asyncio.create_task(source.sample())
        await asyncio.sleep(0)  # the second caller is waiting too
    finally:
        gate.set()

    one, two = await asyncio.gather(first, second)

    assert one is two
    assert fake.calls.count("nvmlDeviceGetCount") == 1


async def test_close_shuts_nvml_down_and_further_samples_fail() -> None:
    fake = FakeNvml(FakeGpu())
    source = NvmlSource(timeout_s=TIMEOUT_S, nvml=_conforms(fake))
    await source.sample()

    await source.close()
    await source.close()

    assert fake.calls.count("nvmlShutdown") == 1
    with pytest.raises(ProbeError, match="closed"):
        await source.sample()


async def test_close_right_after_a_sample_still_shuts_nvml_down() -> None:
    gate = threading.Event()
    fake = FakeNvml(FakeGpu(hang={"nvmlDeviceGetName": gate}))
    source = NvmlSource(timeout_s=5, nvml=_conforms(fake))
    sampling = asyncio.create_task(source.sample())
    assert await asyncio.to_thread(fake.blocked.wait, 5)
    closing = asyncio.create_task(source.close())  # queued behind the running sample
    await asyncio.sleep(0)
    gate.set()

    await asyncio.gather(sampling, closing)

    assert fake.calls[-1] == "nvmlShutdown"


async def test_close_does_not_wait_for_a_hung_call() -> None:
    gate = threading.Event()
    fake = FakeNvml(FakeGpu())
    source = NvmlSource(timeout_s=TIMEOUT_S, nvml=_conforms(fake))
    await source.sample()
    fake.gpus[0].hang["nvmlDeviceGetName"] = gate
    try:
        with pytest.raises(ProbeError):
            await source.sample()

        started = time.monotonic()
        await source.close()

        assert time.monotonic() - started < TIMEOUT_S / 2
        assert "nvmlShutdown" not in fake.calls
    finally:
        gate.set()
    await _until_idle(source)


async def test_without_the_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    source = NvmlSource(timeout_s=5)
    try:
        with pytest.raises(ProbeError) as caught:
            await source.sample()
    finally:
        await source.close()

    assert caught.value.reason == "library_not_found"
    assert "pip install nvidia-ml-py" in str(caught.value)


# -- the real pynvml on this machine (no NVIDIA library) -------------------------------


def _require_no_nvml() -> None:
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has libnvidia-ml: these tests check a machine without it")


async def test_real_nvml_missing_says_what_to_do() -> None:
    _require_no_nvml()
    source = NvmlSource(timeout_s=5)
    try:
        with pytest.raises(ProbeError) as caught:
            await source.sample()
        with pytest.raises(ProbeError):  # and again: init is retried, not cached as failed
            await source.sample()
    finally:
        await source.close()

    assert caught.value.reason in ("library_not_found", "driver_not_loaded")
    if caught.value.reason == "library_not_found":
        assert "libnvidia-ml.so.1 not found" in str(caught.value)
        assert "NVIDIA runtime" in str(caught.value)


async def test_real_nvml_missing_through_the_monitor_and_metrics() -> None:
    _require_no_nvml()
    monitor = GpuMonitor(NvmlSource(timeout_s=5), poll_interval_s=1, stale_after_s=10)
    registry = CollectorRegistry()
    GpuCollector({"local": monitor}, registry)
    try:
        reading = await monitor.read()
    finally:
        await monitor.close()

    assert reading is None
    assert monitor.up is False
    assert monitor.error is not None
    assert monitor.reason in ("library_not_found", "driver_not_loaded")
    status = gpu_status_view(monitor.status())
    assert (status["source"], status["up"], status["stale"], status["gpus"]) == (
        "nvml",
        False,
        True,
        [],
    )
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    assert [s.value for s in families["microscheduler_gpu_probe_up"].samples] == [0.0]
    assert families["microscheduler_gpu_memory_used_bytes"].samples == []

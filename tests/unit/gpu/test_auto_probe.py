"""`gpu.probe: auto` (the default): NVML when it loads and sees a GPU, else no probe and a
warning saying why and what to set; `check-config` prints that warning and still exits 0.
NVML is a typed fake here (`tests.fakes.nvml`), never the machine's driver."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli.common import OK
from app.cli.serve import run_check_config
from app.gpu.auto import REMOTE_WARNING, detect_nvml, probe_warnings
from app.settings import GpuConfig, Settings
from tests.fakes.nvml import NoNvml


class OneGpuNvml(NoNvml):
    """NVML that loads and sees `count` GPUs; `nvmlInit` waits for `gate` when given."""

    def __init__(self, count: int = 1, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.count = count
        self.gate = gate
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # type: ignore[override]
        self.inits += 1
        if self.gate is not None:
            self.gate.wait(10)

    def nvmlShutdown(self) -> None:  # type: ignore[override]
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count


def backends() -> dict[str, Any]:
    return {"a": {"url": "http://127.0.0.1:9", "models": ["m"], "runtime": {"kind": "external"}}}


def test_the_default_probe_is_auto_not_a_simulated_gpu() -> None:
    assert GpuConfig().probe == "auto"
    assert Settings(backends=backends()).gpu.probe == "auto"


def test_auto_with_nvml_and_a_gpu_is_nvml() -> None:
    nvml = OneGpuNvml()
    found = detect_nvml(timeout_s=2, nvml=nvml)
    assert (found.probe, found.warning) == ("nvml", None)
    assert (nvml.inits, nvml.shutdowns) == (1, 1)  # asked once, and let go


def test_auto_without_the_library_is_none_and_says_why_and_what_to_set() -> None:
    found = detect_nvml(timeout_s=2, nvml=NoNvml())
    assert found.probe == "none"
    assert found.warning is not None
    assert "NVML did not load: NVML Shared Library Not Found" in found.warning
    assert "VRAM admission is off" in found.warning
    assert "gpu: {probe: nvml}" in found.warning
    assert "probe: sim" in found.warning


def test_auto_with_no_gpu_is_none() -> None:
    found = detect_nvml(timeout_s=2, nvml=OneGpuNvml(count=0))
    assert found.probe == "none"
    assert "NVML loaded but sees no GPU" in (found.warning or "")


def test_auto_with_a_hung_driver_is_none_after_its_timeout() -> None:
    gate = threading.Event()
    try:
        found = detect_nvml(timeout_s=0.2, nvml=OneGpuNvml(gate=gate))
    finally:
        gate.set()  # the worker thread returns
    assert found.probe == "none"
    assert "NVML did not answer within 0.2 s" in (found.warning or "")


def test_check_config_warnings_name_the_key() -> None:
    settings = Settings(
        backends=backends(),
        hosts={"node-c": {"gpu": {}}},  # auto on another host: never this machine's NVML
    )
    local, remote = probe_warnings(settings, nvml=NoNvml())
    assert local.startswith("gpu.probe: gpu.probe is auto and NVML did not load")
    assert remote == f"hosts.node-c.gpu.probe: {REMOTE_WARNING}"
    assert probe_warnings(Settings(backends=backends(), gpu={"probe": "sim"})) == []
    assert probe_warnings(Settings(backends=backends()), nvml=OneGpuNvml()) == []


def test_check_config_prints_the_warning_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"backends": backends()}))
    code = run_check_config(argparse.Namespace(config=str(tmp_path)), nvml=NoNvml())
    out = capsys.readouterr().out
    assert code == OK
    assert "configuration is valid" in out
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: gpu.probe")]
    assert "VRAM admission is off" in warning
    assert "gpu: {probe: nvml}" in warning

"""`gpu.probe: auto` in a real gateway process, on a machine without NVML (a `pynvml`
without its library first on PYTHONPATH: tests/fixtures/no_nvml, the same on a machine
with a GPU): a models.yaml without a `gpu:` block runs without admission and says so in
the log (WARNING), /status, `check-config` and a banner on the control page (Chromium,
Playwright). And the gateway process reads the tests' simulated host RAM, never the
machine's (`host_ram.sim` through the environment, tests/fakes/processes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.test_control_page import ARTIFACTS, _require_browser
from tests.fakes.processes import ROOT, fake_vllm_process, gateway_process

pytestmark = pytest.mark.e2e

NO_NVML = {"PYTHONPATH": str(ROOT / "tests" / "fixtures" / "no_nvml")}


def no_gpu_block(url: str) -> dict[str, Any]:
    """An external fake holding 40000 MiB: more than the old default's 32 GiB sim GPU."""
    return {"backends": {"outside": {"url": url, "models": ["outside-model"], "vram_mib": 40000,
                                     "runtime": {"kind": "external"}}}}  # fmt: skip


def test_without_nvml_a_config_without_gpu_says_so_everywhere(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    with (
        fake_vllm_process("outside-model") as url,
        gateway_process(no_gpu_block(url), env=NO_NVML, wait_ready=True) as gw,
    ):
        status = httpx.get(gw.url + "/status", timeout=5).json()
        gpu = status["gpu"]
        assert (gpu["probe"], gpu["gpus"]) == ("none", [])
        assert "gpu.probe is auto and NVML did not load" in gpu["warning"]
        assert "VRAM admission is off" in gpu["warning"]
        (line,) = [x for x in gw.log().splitlines() if "gpu probe host=local" in x]
        assert "WARNING" in line
        assert "gpu.probe is auto and NVML did not load" in line
        # The tests' host RAM, not this machine's.
        ram = status["host_ram"]
        assert (ram["probe"], ram["total_mib"], ram["available_mib"]) == ("sim", 65536, 40960)

        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(gw.url + "/ui")
            banner = page.locator('[data-testid="probe-warning"]')
            sync_api.expect(banner).to_be_visible()
            sync_api.expect(banner).to_contain_text("No GPU probe: gpu.probe is auto")
            sync_api.expect(banner).to_contain_text("gpu: {probe: nvml}")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "control-page-no-probe.png"))
            browser.close()

    config = tmp_path / "config"
    config.mkdir()
    (config / "models.yaml").write_text(yaml.safe_dump(no_gpu_block("http://127.0.0.1:9")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    checked = subprocess.run(
        [sys.executable, "-m", "app.cli", "check-config", "--config", str(config)],
        cwd=ROOT, env={**env, **NO_NVML}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert "configuration is valid" in checked.stdout
    assert "warning: gpu.probe: gpu.probe is auto and NVML did not load" in checked.stdout


def test_with_probe_sim_there_is_no_banner(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    with (
        fake_vllm_process("outside-model") as url,
        gateway_process(
            {**no_gpu_block(url), "gpu": {"probe": "sim", "sim": {"total_mib": 81920}}},
            env=NO_NVML,
            wait_ready=True,
        ) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        assert httpx.get(gw.url + "/status", timeout=5).json()["gpu"]["warning"] is None
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(gw.url + "/ui")
        sync_api.expect(page.locator('[data-testid="backends"]')).to_contain_text("outside")
        sync_api.expect(page.locator('[data-testid="probe-warning"]')).to_be_hidden()
        browser.close()

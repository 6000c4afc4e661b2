"""A second `microscheduler serve` on a port a running gateway holds (a second `make run`)
fails at once on the address, exit 1, before it starts any backend: no backend state, no
VRAM refusal in its log, and the first gateway and its backends are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.fakes.processes import ROOT, gateway_process, sim_gpu_models

pytestmark = pytest.mark.e2e


def test_a_second_gateway_on_a_taken_port_fails_before_starting_anything(
    tmp_path: Path,
) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models = sim_gpu_models(tmp_path / "ledger")
    (config_dir / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    with gateway_process(config_dir=config_dir, wait_ready=True) as first:
        port = urlsplit(first.url).port
        assert port is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
        env["MICROSCHEDULER_STATE_DIR"] = str(tmp_path / "second-var")
        second = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--config", str(config_dir),
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        output = second.stdout + second.stderr
        assert second.returncode == 1, output
        assert f"error: serve: cannot listen on 127.0.0.1:{port}: " in second.stderr
        assert "address already in use" in second.stderr.lower()
        assert "backend state" not in output  # nothing was started
        assert "VRAM" not in output
        assert "Traceback" not in output
        # The first gateway still serves, its pinned backend still up.
        assert httpx.get(first.url + "/ready", timeout=10).status_code == 200

"""The control page in a real browser (Debian's chromium driven by Playwright) against a
real gateway process and fake vLLM processes on a simulated GPU.

It opens the page, checks states and VRAM segments, wakes a backend by a request from
outside and sees the page change without a reload, presses stop, yield and restore, and
fails on any error the page logs. A screenshot is kept in var/test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    fake_vllm_process,
    gateway_process,
    sim_gpu_models,
    two_host_models,
)

ARTIFACTS = ROOT / "var" / "test-artifacts"


def _require_browser() -> tuple[Any, str]:
    """Playwright and a chromium: CI must have them (fail); elsewhere skip, saying why."""
    in_ci = os.environ.get("MICROSCHEDULER_REQUIRE_SYSTEM_TOOLS") or os.environ.get("CI")
    chromium = shutil.which("chromium")
    sync_api: Any
    try:
        from playwright import sync_api
    except ImportError:
        sync_api = None
    problem = None
    if sync_api is None:
        problem = "playwright is not installed (pip install -e '.[dev]')"
    elif chromium is None:
        problem = "chromium is not installed (Debian: apt-get install chromium)"
    if problem is not None:
        if in_ci:
            pytest.fail(f"{problem}; .ci/run installs it on CI machines", pytrace=False)
        pytest.skip(problem)
    assert chromium is not None
    return sync_api, chromium


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    with gateway_process(sim_gpu_models(tmp_path / "ledger"), wait_ready=True) as gw:
        yield gw


def test_the_page_follows_the_gateway_and_drives_it(gateway: GatewayProcess) -> None:
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on(
            "console",
            lambda msg: (
                problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
                else None
            ),
        )
        expect = sync_api.expect
        page.goto(gateway.url + "/")  # redirects to /ui
        assert page.url.endswith("/ui")

        pinned = page.locator('[data-testid="backend-pinned"]')
        lazy = page.locator('[data-testid="backend-lazy"]')
        gpu = page.locator('[data-testid="gpu-0"]')
        expect(pinned.locator('[data-field="state"]')).to_have_text("ready")
        expect(lazy.locator('[data-field="state"]')).to_have_text("stopped")
        # What each serves: vLLM's generate runner by default.
        expect(pinned.locator('[data-field="apis"]')).to_have_text(
            "chat · completions · detokenize · messages · responses · tokenize"
        )
        expect(gpu.locator('[data-segment="pinned"]')).to_have_count(1)
        expect(gpu.locator('[data-segment="lazy"]')).to_have_count(0)
        # One machine: no host headings, no host column.
        expect(page.locator('[data-testid^="host-"]')).to_have_count(0)
        expect(page.locator('th[data-column="host"]')).to_be_hidden()
        expect(pinned.locator('[data-field="host"]')).to_have_count(0)

        # A request from outside wakes the lazy backend: the page follows, no reload.
        answer: dict[str, Any] = {}

        def ask() -> None:
            body = {"model": "lazy-model", "messages": [{"role": "user", "content": "hi"}]}
            answer["status"] = httpx.post(
                gateway.url + "/v1/chat/completions", json=body, timeout=30
            ).status_code

        asker = threading.Thread(target=ask)
        asker.start()
        expect(lazy.locator('[data-field="state"]')).to_have_text("ready", timeout=15_000)
        asker.join(30)
        assert answer == {"status": 200}
        expect(gpu.locator('[data-segment="lazy"]')).to_have_count(1)
        expect(page.locator('[data-testid="events"]')).to_contain_text("backend=lazy state=ready")

        # Stop it from the page.
        lazy.locator('[data-action="stop"]').click()
        expect(lazy.locator('[data-field="state"]')).to_have_text("stopped", timeout=15_000)
        expect(gpu.locator('[data-segment="lazy"]')).to_have_count(0)

        # Yield the whole GPU (pinned included), then restore.
        page.locator('[data-field="include-pinned"]').check()
        page.locator('[data-action="yield"]').click()
        expect(page.locator('[data-testid="yield-state"]')).to_contain_text(
            "yielded", timeout=15_000
        )
        expect(pinned.locator('[data-field="state"]')).to_have_text("stopped")
        expect(gpu.locator('[data-segment="pinned"]')).to_have_count(0)
        # An action the gateway refuses is shown in words: the yield blocks the start.
        pinned.locator('[data-action="start"]').click()
        expect(page.locator('[data-testid="messages"]')).to_contain_text("blocked")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-yielded.png"), full_page=True)
        page.locator('[data-action="restore"]').click()
        expect(page.locator('[data-testid="yield-state"]')).not_to_contain_text("yielded")
        expect(pinned.locator('[data-field="state"]')).to_have_text("ready", timeout=15_000)
        expect(gpu.locator('[data-segment="pinned"]')).to_have_count(1)
        page.screenshot(path=str(ARTIFACTS / "control-page.png"), full_page=True)
        browser.close()
    # Chromium logs every refused fetch; the one refusal provoked above is expected.
    refused = "Failed to load resource: the server responded with a status of 409 (Conflict)"
    assert problems.count(f"console error: {refused}") == 1, problems
    unexpected = [p for p in problems if p != f"console error: {refused}"]
    assert unexpected == [], "\n".join(unexpected)


def test_with_an_admin_key_the_page_asks_once_and_keeps_it_for_the_tab(
    tmp_path: Path,
) -> None:
    sync_api, chromium = _require_browser()
    env = {"MICROSCHEDULER_ADMIN_KEY": "page-admin-key"}
    models = sim_gpu_models(tmp_path / "ledger")
    with (
        gateway_process(models, env=env, wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        expect = sync_api.expect
        page.goto(gw.url + "/ui")
        expect(page.locator("#key-form")).to_be_visible()
        expect(page.locator('[data-testid="connection"]')).to_have_text("admin key needed")
        page.locator("#key-input").fill("wrong")
        page.locator("#key-form button").click()
        expect(page.locator("#key-form")).to_be_visible()  # refused: asked again
        page.locator("#key-input").fill("page-admin-key")
        page.locator("#key-form button").click()
        expect(page.locator('[data-testid="connection"]')).to_have_text("live")
        expect(page.locator("#key-form")).to_be_hidden()
        pinned = page.locator('[data-testid="backend-pinned"] [data-field="state"]')
        expect(pinned).to_have_text("ready")
        page.reload()  # the key stays for the tab
        expect(page.locator('[data-testid="connection"]')).to_have_text("live")
        stored = page.evaluate("sessionStorage.getItem('microscheduler.adminKey')")
        assert stored == "page-admin-key"
        browser.close()


def test_the_page_shows_each_client_key_and_what_its_limits_refused(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    config = tmp_path / "config"
    config.mkdir()
    (config / "models.yaml").write_text(
        yaml.safe_dump(sim_gpu_models(tmp_path / "ledger"), sort_keys=False)
    )
    keys = {
        "agents": {"key_env": "AGENTS_KEY", "models": ["pinned-model"], "priority": "high",
                   "rpm": 2, "cloud": False},
        "family": {"key_env": "FAMILY_KEY", "max_concurrent": 4},
    }  # fmt: skip
    (config / "keys.yaml").write_text(yaml.safe_dump({"keys": keys}))
    env = {"AGENTS_KEY": "sk-agents-page", "FAMILY_KEY": "sk-family-page"}
    with (
        gateway_process(config_dir=config, env=env, wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        expect = sync_api.expect
        page.goto(gw.url + "/ui")
        agents = page.locator('[data-testid="keys"] tr[data-key="agents"]')
        expect(agents).to_contain_text("pinned-model")
        body = {"model": "pinned-model", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"authorization": "Bearer sk-agents-page"}
        statuses = [
            httpx.post(
                gw.url + "/v1/chat/completions", json=body, headers=auth, timeout=10
            ).status_code
            for _ in range(3)
        ]
        assert statuses == [200, 200, 429]
        lazy = {**body, "model": "lazy-model"}
        refused = httpx.post(gw.url + "/v1/chat/completions", json=lazy, headers=auth, timeout=10)
        assert refused.status_code == 403
        # The page follows: requests in the window, and the refusals by limit.
        expect(agents).to_contain_text("2 / 2")
        expect(agents.locator("td").last).to_have_text("rpm 1, model not allowed 1")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-keys.png"), full_page=True)
        text = page.content()
        assert "sk-agents-page" not in text
        assert "sk-family-page" not in text
        browser.close()


def test_with_two_hosts_the_page_shows_each_hosts_gpus_and_yields_one(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    with (
        fake_vllm_process("remote-model") as remote_url,
        gateway_process(two_host_models(tmp_path / "ledger", remote_url), wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on(
            "console",
            lambda msg: (
                problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
                else None
            ),
        )
        expect = sync_api.expect
        page.goto(gw.url + "/ui")
        local = page.locator('[data-testid="host-local"]')
        node_c = page.locator('[data-testid="host-node-c"]')
        expect(node_c.locator(".host-head")).to_contain_text("node-c")
        expect(node_c.locator(".host-head")).to_contain_text("probe sim")
        expect(node_c.locator('[data-field="probe-state"]')).to_have_text("up")
        expect(local.locator('[data-field="probe-state"]')).to_have_text("up")
        # Each host's GPU 0 shows its own backends only.
        remote_gpu = node_c.locator('[data-testid="gpu-0"]')
        expect(remote_gpu).to_contain_text("12,000 MiB (placed)")  # of 32 GiB
        expect(remote_gpu).to_contain_text("11.7 GiB used of 32.0 GiB")
        expect(remote_gpu.locator('[data-segment="remote"]')).to_have_count(1)
        expect(remote_gpu.locator('[data-segment="pinned"]')).to_have_count(0)
        local_gpu = local.locator('[data-testid="gpu-0"]')
        expect(local_gpu).to_contain_text("of 24.0 GiB")
        expect(local_gpu.locator('[data-segment="pinned"]')).to_have_count(1)
        expect(local_gpu.locator('[data-segment="remote"]')).to_have_count(0)
        # The host column.
        expect(page.locator('th[data-column="host"]')).to_be_visible()
        backend = page.locator('[data-testid="backend-remote"]')
        expect(backend.locator('[data-field="host"]')).to_have_text("node-c")
        expect(page.locator('[data-testid="backend-pinned"] [data-field="host"]')).to_have_text(
            "local"
        )
        expect(page.locator("#gaming-host")).to_be_visible()

        # Yield node-c's GPU from its heading: the stream pushes node-c's holds; the local
        # host keeps its models.
        node_c.locator('[data-action="yield-host"]').click()
        expect(node_c.locator('[data-field="yield"]')).to_contain_text("yielded (control page)")
        expect(local.locator('[data-field="yield"]')).to_have_text("no yield")
        expect(page.locator('[data-testid="yield-state"]')).not_to_contain_text("yielded")
        assert httpx.get(gw.url + "/vram/yield?host=node-c").json()["state"] == "yielded"
        assert httpx.get(gw.url + "/vram/yield").json()["state"] == "none"
        page.screenshot(path="/tmp/hosts-page.png", full_page=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-hosts.png"), full_page=True)
        node_c.locator('[data-action="restore-host"]').click()
        expect(node_c.locator('[data-field="yield"]')).to_have_text("no yield")
        assert httpx.get(gw.url + "/vram/yield?host=node-c").json()["state"] == "none"
        browser.close()
    assert problems == [], "\n".join(problems)

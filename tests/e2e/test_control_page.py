"""The control page in a real browser (Debian's chromium driven by Playwright) against a
real gateway process and fake vLLM processes on a simulated GPU.

It opens the page, checks states and VRAM segments, wakes a backend by a request from
outside and sees the page change without a reload, presses stop, yield and restore, shows
the usage per key and the schedules, and fails on any error the page logs. Screenshots
are kept in var/test-artifacts/.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
    sim_gpu_models,
    two_host_models,
)

pytestmark = pytest.mark.e2e

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
        # What each serves, as /status says (learned from its server's /openapi.json).
        apis = next(
            b["apis"]
            for b in httpx.get(gateway.url + "/status", timeout=10).json()["backends"]
            if b["name"] == "pinned"
        )
        assert "chat" in apis
        expect(pinned.locator('[data-field="apis"]')).to_have_text(" · ".join(apis))
        expect(gpu.locator('[data-segment="pinned"]')).to_have_count(1)
        expect(gpu.locator('[data-segment="lazy"]')).to_have_count(0)
        # One machine: no host headings, no host on the backends.
        expect(page.locator('[data-testid^="host-"]')).to_have_count(0)
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

        # Unload it from the page (POST /models/unload): its fake has no sleep mode, so its
        # idle method stops it.
        lazy.locator('[data-action="unload"]').click()
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
        # An action that cannot apply is disabled, saying why: the yield blocks the load.
        start = pinned.locator('[data-action="load"]')
        expect(start).to_be_disabled()
        expect(start).to_have_attribute("title", re.compile("blocked by the VRAM yield"))
        # A second holder (a game, by the API): the page names every holder, and its
        # Restore button ends every hold.
        joined = httpx.post(gateway.url + "/vram/yield", json={"reason": "game"}, timeout=30)
        assert joined.json()["holders"] == ["control page", "game"], joined.text
        expect(page.locator('[data-testid="yield-state"]')).to_contain_text(
            "yielded (control page, game)"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-yielded.png"), full_page=True)
        page.locator('[data-action="restore"]').click()
        expect(page.locator('[data-testid="yield-state"]')).not_to_contain_text("yielded")
        expect(pinned.locator('[data-field="state"]')).to_have_text("ready", timeout=15_000)
        expect(gpu.locator('[data-segment="pinned"]')).to_have_count(1)
        page.screenshot(path=str(ARTIFACTS / "control-page.png"), full_page=True)
        browser.close()
    assert problems == [], "\n".join(problems)


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
        # Nothing known without the key: the yield control says so, not "no yield".
        yield_state = page.locator('[data-testid="yield-state"]')
        expect(yield_state).to_have_text(
            "unknown: the admin key is needed to see or change the yield"
        )
        page.locator("#key-input").fill("wrong")
        page.locator("#key-form button").click()
        expect(page.locator("#key-form")).to_be_visible()  # refused: asked again
        page.locator("#key-input").fill("page-admin-key")
        page.locator("#key-form button").click()
        expect(page.locator('[data-testid="connection"]')).to_have_text("live")
        expect(page.locator("#key-form")).to_be_hidden()
        expect(yield_state).to_have_text("no yield: the models may use the GPU")
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
        # Each backend says its host.
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


def truth_models(ledger: Path, outside_url: str) -> dict[str, Any]:
    """A simulated 24 GiB GPU with: `pinned`; `sleeper` (lazy, sleeps at level 1 when the
    GPU is yielded, within an 8000 MiB host RAM budget; idles after 300 s); `slow` (lazy,
    prints vLLM's start-up lines over 4 s); `outside`, an external server."""
    models = sim_gpu_models(ledger)
    port = models["backends"]["lazy"]["url"].rsplit(":", 1)[1]
    sleeper = models["backends"].pop("lazy")
    sleeper["models"] = ["sleeper-model"]
    sleeper["idle_ttl_s"] = 300
    sleeper["yield"] = {"method": "sleep", "level": 1}
    sleeper["runtime"]["env"] = {"VLLM_SERVER_DEV_MODE": "1"}
    sleeper["runtime"]["command"][6] = "sleeper-model"
    assert sleeper["runtime"]["command"][4] == port
    slow_port = free_port()
    slow = {
        "url": f"http://127.0.0.1:{slow_port}", "models": ["slow-model"], "lifecycle": "lazy",
        "vram_mib": 2000,
        "runtime": {"kind": "process", "command": [
            "{python}", "-m", "app.sim.vllm", "--port", str(slow_port), "--model", "slow-model",
            "--startup-delay", "4", "--print-startup-log", "--vram-mib", "2000",
            "--sim-gpu-dir", str(ledger)]},
    }  # fmt: skip
    outside = {"url": outside_url, "models": ["outside-model"], "vram_mib": 1000,
               "runtime": {"kind": "external"}}  # fmt: skip
    models["backends"].update(sleeper=sleeper, slow=slow, outside=outside)
    models["host_ram"] = {"sleep_budget_mib": 8000, "reserve_mib": 0}
    return models


def ask_for(url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code


def watch_console(page: Any, problems: list[str]) -> None:
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda msg: (
            problems.append(f"console {msg.type}: {msg.text}")
            if msg.type in ("error", "warning")
            else None
        ),
    )


def drawn(gpu: Any) -> dict[str, int]:
    """Each segment of a GPU bar: its name (or kind) and the MiB it draws."""
    segments = gpu.locator(".bar .seg").evaluate_all(
        "nodes => nodes.map(n => [n.dataset.segment || n.dataset.segmentKind, n.dataset.mib])"
    )
    return {name: int(mib) for name, mib in segments}


def test_the_page_tells_the_truth_on_a_phone_and_a_desktop(tmp_path: Path) -> None:
    """At 1280 and 390 px: a start's progress, a backend's output, the activity, actions
    that cannot apply disabled with their reason, and during a yield with sleep the
    sleeper drawn at what it keeps asleep, the host RAM it is charged, no bar beyond its
    total, and no horizontal scroll on the phone."""
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    ledger = tmp_path / "ledger"
    with (
        fake_vllm_process("outside-model") as outside_url,
        gateway_process(truth_models(ledger, outside_url), wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        watch_console(page, problems)
        expect = sync_api.expect
        page.goto(gw.url + "/ui")

        # An external backend: the gateway neither starts nor stops it, nor reads its output.
        outside = page.locator('[data-testid="backend-outside"]')
        expect(outside.locator('[data-field="state"]')).to_have_text("ready")
        for action in ("load", "unload", "logs"):
            button = outside.locator(f'[data-action="{action}"]')
            expect(button).to_be_disabled()
            expect(button).to_have_attribute("title", re.compile(r"\S"))
        expect(outside.locator('[data-action="unload"]')).to_have_attribute(
            "title", re.compile("not managed by the gateway")
        )
        pinned_start = page.locator('[data-testid="backend-pinned"] [data-action="load"]')
        expect(pinned_start).to_have_attribute("title", "already ready")

        # A start shows its progress while it loads, then goes.
        slow = page.locator('[data-testid="backend-slow"]')
        asker = threading.Thread(target=ask_for, args=(gw.url, "slow-model"))
        asker.start()
        load = slow.locator('[data-testid="load-slow"]')
        expect(load).to_be_visible(timeout=10_000)
        expect(load.locator('[role="progressbar"]')).to_have_count(1)
        expect(load).to_contain_text("loading weights", timeout=10_000)  # vLLM's phase, in words
        expect(load).to_have_attribute("data-percent", re.compile(r"^[1-9]\d*$"))
        page.screenshot(path=str(ARTIFACTS / "control-page-starting-1280.png"), full_page=True)
        expect(slow.locator('[data-field="state"]')).to_have_text("ready", timeout=20_000)
        expect(load).to_have_count(0)
        asker.join(30)

        # Its output, live in a panel; closing it ends the request.
        slow.locator('[data-action="logs"]').click()
        logs = page.locator('[data-testid="logs-slow"]')
        expect(logs).to_be_visible()
        expect(logs.locator('[data-field="log"]')).to_contain_text("Starting vLLM server on")
        expect(logs.locator('[data-field="log"]')).to_contain_text("listening on")
        page.screenshot(path=str(ARTIFACTS / "control-page-logs-1280.png"), full_page=False)
        logs.locator('[data-action="close-logs"]').click()
        expect(logs).to_have_count(0)

        # The sleeper serves a request: the activity lists it, its idle stop counts down.
        assert ask_for(gw.url, "sleeper-model") == 200
        sleeper = page.locator('[data-testid="backend-sleeper"]')
        activity = page.locator('[data-testid="activity"]')
        expect(activity.locator('tr[data-model="sleeper-model"]').first).to_contain_text("200")
        idle = sleeper.locator('[data-field="idle-stop"]')
        # Its idle action is a sleep (idle: auto, and its fake offers sleep mode).
        expect(idle).to_contain_text("idle sleep in 4 min")
        before = idle.text_content()
        expect(idle).not_to_have_text(before or "", timeout=5_000)  # counts down

        # A yield with sleep: the sleeper keeps only its asleep MiB, and the bar says so.
        yielded = httpx.post(gw.url + "/vram/yield", json={"reason": "test"}, timeout=30).json()
        assert yielded["slept"] == ["sleeper"], yielded
        expect(sleeper.locator('[data-field="state"]')).to_have_text("sleeping", timeout=15_000)
        status = httpx.get(gw.url + "/status", timeout=10).json()
        views = {b["name"]: b for b in status["backends"]}
        asleep = views["sleeper"]["asleep_mib"]
        assert asleep is not None
        assert asleep < views["sleeper"]["vram_mib"]
        gpu = page.locator('[data-testid="gpu-0"]')
        segment = gpu.locator('[data-segment="sleeper"]')
        expect(segment).to_have_attribute("data-mib", str(asleep))
        total = status["gpu"]["gpus"][0]["total_mib"]
        segments = drawn(gpu)
        assert segments["sleeper"] == asleep
        assert sum(segments.values()) <= total, segments
        expect(gpu).to_contain_text(f"sleeper {asleep:,} MiB asleep")
        # The host RAM it is charged, inside the budget.
        ram = status["host_ram"]
        ram_bar = page.locator('[data-testid="ram-local"] .bar')
        expect(ram_bar).to_have_attribute("data-budget-mib", str(ram["budget_mib"]))
        expect(ram_bar).to_have_attribute("data-total-mib", str(ram["total_mib"]))
        charged = {s["backend"]: s["charged_mib"] for s in ram["sleepers"]}
        assert list(charged) == ["sleeper"], ram
        expect(ram_bar.locator('[data-sleeper="sleeper"]')).to_have_attribute(
            "data-mib", str(charged["sleeper"])
        )
        ram_segments = ram_bar.locator(".seg").evaluate_all("ns => ns.map(n => +n.dataset.mib)")
        assert sum(ram_segments) <= ram["total_mib"], ram_segments
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-truth-1280.png"), full_page=True)

        # The same on a phone: nothing wider than the screen, every action on it, the
        # reasons for the disabled ones in words.
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        watch_console(phone, problems)
        phone.goto(gw.url + "/ui")
        expect(phone.locator('[data-testid="gpu-0"] [data-segment="sleeper"]')).to_have_attribute(
            "data-mib", str(asleep)
        )
        expect(phone.locator('[data-testid="activity"] tr').first).to_be_visible()
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        for box in phone.locator("main button").evaluate_all(
            "ns => ns.map(n => n.getBoundingClientRect()).map(r => [r.left, r.right])"
        ):
            assert box[0] >= 0, box
            assert box[1] <= 390, box
        why = phone.locator('[data-testid="backend-outside"] [data-field="disabled-why"]')
        expect(why).to_be_visible()
        expect(why).to_contain_text("unload: not managed by the gateway")
        phone.screenshot(path=str(ARTIFACTS / "control-page-truth-390.png"), full_page=True)
        phone.locator('[data-testid="backend-sleeper"] [data-action="logs"]').click()
        expect(phone.locator('[data-testid="logs-sleeper"] [data-field="log"]')).to_contain_text(
            "listening on"
        )
        phone.screenshot(path=str(ARTIFACTS / "control-page-logs-390.png"), full_page=False)
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        browser.close()
    assert problems == [], "\n".join(problems)


DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
KEY = "sk-agents-living"


def window(name: str, start: datetime, end: datetime, **action: Any) -> dict[str, Any]:
    """A weekly window (UTC) from `start` to `end` (under a day later), on `start`'s day."""
    return {"name": name, "days": [DAYS[start.weekday()]], "from": start.strftime("%H:%M"),
            "to": end.strftime("%H:%M"), **action}  # fmt: skip


def living_config(tmp_path: Path, cloud_url: str, now: datetime) -> Path:
    """`sim_gpu_models` with: the key `agents`; `reasoning`, an external backend that does
    not answer (a closed port), chained to `cloud` (a fake vLLM priced 1.0 / 2.0 per
    million tokens); in UTC, the window `office` (keep `lazy` warm) active from an hour
    ago to two hours from now, and `evening` (a yield) from three to four hours from now."""
    config = tmp_path / "config"
    config.mkdir(parents=True)
    models = sim_gpu_models(tmp_path / "ledger")
    reasoning = {"url": f"http://127.0.0.1:{free_port()}", "models": ["reasoning"],
                 "runtime": {"kind": "external"}}  # fmt: skip
    models["backends"]["reasoning"] = reasoning
    models["timezone"] = "UTC"
    hour = timedelta(hours=1)
    models["schedules"] = [
        window("office", now - hour, now + 2 * hour, action="keep_warm", backend="lazy"),
        window("evening", now + 3 * hour, now + 4 * hour, action="yield", reason="gaming"),
    ]
    providers = {
        "providers": {"cloud": {"kind": "openai", "base_url": cloud_url + "/v1",
                                "model": "cloud-model",
                                "cost_per_mtok": {"input": 1.0, "output": 2.0}}},
        "chains": {"reasoning": ["reasoning", "cloud"]},
    }  # fmt: skip
    keys = {"keys": {"agents": {"key_env": "AGENTS_KEY"}}}
    (config / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))
    (config / "cloud_providers.yaml").write_text(yaml.safe_dump(providers))
    (config / "keys.yaml").write_text(yaml.safe_dump(keys))
    return config


def no_horizontal_scroll(page: Any, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for box in page.locator("main section").evaluate_all(
        "ns => ns.map(n => n.getBoundingClientRect()).map(r => [r.left, r.right])"
    ):
        assert box[0] >= 0, box
        assert box[1] <= width, box


def ask_as(url: str, model: str, key: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    auth = {"authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=30)


def test_the_page_shows_usage_per_key_and_the_schedules(tmp_path: Path) -> None:
    """At 1280 and 390 px: a key's local and cloud tokens today and over 7 days with the
    cost estimate; the active window highlighted with its next edge (its end, as a local
    time and counting down), the inactive one with its start; a stop of the kept-warm
    backend shown as "overridden until next edge" (pushed by the stream); the running
    config's hash, and a reload's new one pushed too; no horizontal scroll on the phone."""
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    office_end = (now + timedelta(hours=2)).timestamp()
    with (
        fake_vllm_process("cloud-model", "--max-tokens", "12") as cloud_url,
        gateway_process(
            config_dir=(config := living_config(tmp_path, cloud_url, now)),
            env={"AGENTS_KEY": KEY},
        ) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        status = httpx.get(gw.url + "/status", timeout=10).json()
        shown = {s["name"]: s for s in status["schedules"]}
        assert (shown["office"]["active"], shown["office"]["next_edge_at"]) == (True, office_end)
        assert shown["evening"]["active"] is False

        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        expect = sync_api.expect
        desktop = browser.new_page(viewport={"width": 1280, "height": 900})
        watch_console(desktop, problems)
        desktop.goto(gw.url + "/ui")
        pinned = desktop.locator('[data-testid="backend-pinned"] [data-field="state"]')
        expect(pinned).to_have_text("ready", timeout=20_000)
        # A local request (pinned) and a cloud one (reasoning does not answer: the chain's
        # next entry, the cloud, does), both through the key.
        assert ask_as(gw.url, "pinned-model", KEY).status_code == 200
        cloud = ask_as(gw.url, "reasoning", KEY)
        assert (cloud.status_code, cloud.json()["model"]) == (200, "cloud-model")
        phone = browser.new_page(viewport={"width": 390, "height": 844})
        watch_console(phone, problems)
        phone.goto(gw.url + "/ui")

        for page, width in ((desktop, 1280), (phone, 390)):
            agents = page.locator('[data-testid="usage"] tr[data-key="agents"]')
            for span in ("today", "7 days"):
                expect(agents.locator(f'[data-field="{span}-local"]')).to_have_text(
                    re.compile(r"^[1-9][\d,]*$"), timeout=15_000
                )
                expect(agents.locator(f'[data-field="{span}-cloud"]')).to_have_text(
                    re.compile(r"^[1-9][\d,]*$")
                )
                expect(agents.locator(f'[data-field="{span}-cost"]')).to_have_text(
                    re.compile(r"^0\.0*[1-9]\d*$")
                )

            office = page.locator('[data-testid="schedules"] [data-schedule="office"]')
            evening = page.locator('[data-testid="schedules"] [data-schedule="evening"]')
            expect(office).to_have_attribute("data-active", "true")
            expect(office).to_have_class(re.compile(r"\bactive\b"))
            expect(office.locator('[data-field="schedule-state"]')).to_have_text("active")
            edge = office.locator('[data-field="next-edge"]')
            expect(edge).to_have_attribute("data-at", re.compile(rf"^{int(office_end)}(\.0+)?$"))
            # Its end in the browser's time, and the time left (the test's `now` is at
            # most a few minutes old).
            local_end = page.evaluate(
                "t => new Date(t * 1000)"
                ".toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'})",
                office_end,
            )
            expect(edge).to_contain_text(re.compile(rf"^ends .*{re.escape(local_end)}"))
            expect(edge).to_contain_text(re.compile(r"in (1 h 5\d|2 h 0) min$"))
            expect(evening).to_have_attribute("data-active", "false")
            expect(evening.locator('[data-field="schedule-state"]')).to_have_text("inactive")
            expect(evening.locator('[data-field="next-edge"]')).to_contain_text(
                re.compile(r"^starts .* in (2 h 5\d|3 h 0) min$")
            )
            expect(office.locator('[data-field="overridden"]')).to_have_count(0)
            header = page.locator('[data-testid="config"]')
            expect(header.locator('[data-field="config-hash"]')).to_have_text(
                status["config"]["hash"]
            )
            expect(header).not_to_contain_text(re.compile("null|undefined"))
            no_horizontal_scroll(page, width)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(
                path=str(ARTIFACTS / f"control-page-living-{width}.png"), full_page=True
            )

        # The kept-warm backend stopped by a person: overridden until the window's end.
        lazy = desktop.locator('[data-testid="backend-lazy"] [data-field="state"]')
        expect(lazy).to_have_text("ready", timeout=20_000)  # started by the window
        stopped = httpx.post(gw.url + "/backends/lazy/stop", timeout=30)
        assert stopped.status_code == 200, stopped.text
        # A reload: the new configuration's hash, pushed.
        with (config / "cloud_providers.yaml").open("a") as file:
            file.write("# edited\n")
        reloaded = httpx.post(gw.url + "/config/reload", timeout=30)
        assert reloaded.status_code == 200, reloaded.text
        new_hash = reloaded.json()["config"]["hash"]
        assert new_hash != status["config"]["hash"]
        for page, width in ((desktop, 1280), (phone, 390)):
            office = page.locator('[data-testid="schedules"] [data-schedule="office"]')
            expect(office.locator('[data-field="overridden"]')).to_have_text(
                "overridden until next edge", timeout=15_000
            )
            header = page.locator('[data-testid="config"]')
            expect(header.locator('[data-field="config-hash"]')).to_have_text(new_hash)
            expect(header).to_contain_text("reloaded")
            no_horizontal_scroll(page, width)
            page.screenshot(
                path=str(ARTIFACTS / f"control-page-overridden-{width}.png"), full_page=True
            )
            for part in ("header", "#schedules-section", "#usage-section"):
                name = part.strip("#").removesuffix("-section")
                page.locator(part).screenshot(
                    path=str(ARTIFACTS / f"control-page-{name}-{width}.png")
                )
        assert KEY not in desktop.content() + phone.content()
        browser.close()
    assert problems == [], "\n".join(problems)

"""The control page never contradicts itself (issue 32, points 6 and 7), in Debian's
chromium driven by Playwright against a real gateway process on a simulated GPU.

- One snapshot, one sum: during a wake (a start admitted, its server not yet seen on the
  GPU) the headline, the legend and the bar say the same; the host RAM bar never draws
  more than the machine has while a sleeper is charged; the idle timer of a backend that
  will sleep says "idle sleep". The snapshot is the gateway's own `/status`, changed to
  that moment and served as the stream (`page.route`), so the moment is not a race.
- An action's result shows in the card or control where it was clicked, once; a yield
  the gateway refuses shows the gateway's words there; TTL 0 says "no expiry"; before the
  admin key, the yield control says that a key is needed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_control_page import ARTIFACTS, _require_browser, drawn, watch_console
from tests.fakes.processes import gateway_process, sim_gpu_models

pytestmark = pytest.mark.e2e
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def during_a_wake(status: dict[str, Any]) -> dict[str, Any]:
    """`status` at the moment a start is admitted: `lazy` starting at its 6,000 MiB, the
    probe still showing only `pinned`'s 8,000; `pinned` idles towards a sleep; a sleeper
    charged 11,000 MiB of host RAM on a machine that shows 1,900 MiB used (its copy is
    not in MemAvailable yet), as the gateway's `/status` gives it."""
    s = copy.deepcopy(status)
    views = {b["name"]: b for b in s["backends"]}
    lazy, pinned = views["lazy"], views["pinned"]
    # Admitted: it holds its GPU (`gpus`, where the page's bar draws it).
    lazy.update(
        state="starting", holds_vram=True, gpus=[0], starting="waiting for the server to listen"
    )
    lazy["load"] = {"phase": "launching", "percent": 0, "eta_s": 4}
    pinned.update(idle_stop_in_s=250.0, idle_ttl_s=300)
    pinned["idle"] = {"method": "sleep", "level": 1, "action": "sleep"}
    gpu = s["gpu"]["gpus"][0]
    gpu.update(used_mib=8000, free_mib=gpu["total_mib"] - 8000)
    total = 24105
    s["host_ram"].update(
        probe="meminfo", up=True, error=None, total_mib=total, available_mib=total - 1900,
        used_mib=1900, other_mib=0, budget_mib=12052, budget_from="50% of MemTotal",
        charged_mib=11000, free_budget_mib=1052,
        sleepers=[{"backend": "lazy", "charged_mib": 11000, "in_use_mib": 1900,
                   "charged_from": "vram_mib", "pending": False}],
    )  # fmt: skip
    s["hosts"][0]["gpu"] = s["gpu"]
    s["hosts"][0]["host_ram"] = s["host_ram"]
    return s


def test_one_snapshot_one_sum_headline_legend_and_bars_agree(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    with (
        gateway_process(sim_gpu_models(tmp_path / "ledger"), wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        snapshot = during_a_wake(httpx.get(gw.url + "/status", timeout=10).json())
        stream = f"event: snapshot\ndata: {json.dumps(snapshot)}\n\n"
        browser = playwright.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        for width, height in ((1280, 900), (390, 844)):
            page = browser.new_page(viewport={"width": width, "height": height})
            watch_console(page, problems)
            page.route(
                "**/status/stream",
                lambda route: route.fulfill(
                    status=200, headers={"content-type": "text/event-stream"}, body=stream
                ),
            )
            expect = sync_api.expect
            page.goto(gw.url + "/ui")
            gpu = page.locator('[data-testid="gpu-0"]')
            expect(gpu.locator('[data-segment="lazy"]')).to_have_attribute("data-mib", "6000")
            total = snapshot["gpu"]["gpus"][0]["total_mib"]  # 24,576
            segments = drawn(gpu)
            assert segments == {"pinned": 8000, "lazy": 6000}, segments
            taken = sum(segments.values())
            free = total - taken
            # The headline counts what the bar draws (the start's reservation too), and
            # the legend's free is the bar's free part, not the probe's 16,576.
            expect(gpu.locator(".bar-head")).to_contain_text(
                f"{gib(taken)} used or reserved of {gib(total)}"
            )
            expect(gpu.locator(".bar-head")).to_contain_text("6,000 MiB reserved for a start")
            expect(gpu.locator(".legend")).to_contain_text(f"free {free:,} MiB")
            expect(gpu.locator(".legend")).not_to_contain_text(f"free {total - 8000:,} MiB")
            # Host RAM: every part within the machine's RAM, adding up to it.
            ram = snapshot["host_ram"]
            ram_bar = page.locator('[data-testid="ram-local"] .bar')
            parts = ram_bar.locator(".seg").evaluate_all("ns => ns.map(n => +n.dataset.mib)")
            assert sum(parts) == ram["total_mib"], parts
            expect(ram_bar.locator('[data-sleeper="lazy"]')).to_have_attribute("data-mib", "1900")
            legend = page.locator('[data-testid="ram-local"] .legend')
            expect(legend).to_contain_text("lazy 1,900 MiB (charged 11,000 MiB)")
            expect(legend).to_contain_text("other 0 MiB")
            # The idle timer says what the idle action is.
            idle = page.locator('[data-testid="backend-pinned"] [data-field="idle-stop"]')
            expect(idle).to_contain_text("idle sleep in 4 min")
            # A start in progress shows its progress, no error.
            lazy = page.locator('[data-testid="backend-lazy"]')
            expect(lazy.locator('[data-testid="load-lazy"]')).to_be_visible()
            expect(lazy).not_to_contain_text("Error")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"control-page-wake-{width}.png"), full_page=True)
            page.close()
        browser.close()
    assert problems == [], "\n".join(problems)


def test_an_actions_answer_shows_where_it_was_clicked(tmp_path: Path) -> None:
    """At 390 px: a load's result in its card, once, nothing at the top; no card says
    what its state already says; a yield of more than the GPU shows the gateway's refusal
    at the yield control, replacing the card's result; TTL 0 says 'no expiry'."""
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    with (
        gateway_process(sim_gpu_models(tmp_path / "ledger"), wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 390, "height": 844})
        watch_console(page, problems)
        expect = sync_api.expect
        page.goto(gw.url + "/ui")
        pinned = page.locator('[data-testid="backend-pinned"]')
        lazy = page.locator('[data-testid="backend-lazy"]')
        expect(pinned.locator('[data-field="state"]')).to_have_text("ready")
        # Nothing unprompted: no card repeats its state as a reason, no result anywhere.
        expect(page.locator("#backends")).not_to_contain_text("already")
        expect(page.locator('[data-field="result"]')).to_have_count(0)

        lazy.locator('[data-action="load"]').click()  # POST /models/load
        result = lazy.locator('[data-field="result"]')
        expect(result.locator("span")).to_have_text("Load lazy: loaded", timeout=15_000)
        expect(result).to_be_in_viewport()
        expect(page.locator('[data-field="result"]')).to_have_count(1)
        expect(page.locator("#messages")).to_be_empty()
        expect(lazy.locator('[data-field="state"]')).to_have_text("ready", timeout=15_000)
        expect(result).to_have_count(1)  # kept through the status updates, in its card
        expect(page.locator("#backends")).not_to_contain_text("already")

        # The yield's options: TTL 0 is said to mean no expiry.
        ttl = page.locator('[data-field="ttl"]')
        note = page.locator('[data-field="ttl-note"]')
        expect(note).to_have_text("restores by itself after 2 h 0 min")
        ttl.fill("0")
        expect(note).to_have_text("no expiry: held until you restore")

        # More than the GPU has: the gateway's refusal at the yield control, as the CLI
        # shows it; the card's result is gone (one result on the page).
        page.locator('[data-field="min-free"]').fill("40000")
        page.locator('[data-action="yield"]').click()
        refused = page.locator('[data-result-slot="yield"] [data-field="result"]')
        expect(refused).to_contain_text("Yield failed: min_free_mib 40,000 MiB is more than")
        expect(refused).to_have_attribute("data-kind", "error")
        expect(refused).to_be_in_viewport()
        expect(page.locator('[data-field="result"]')).to_have_count(1)
        expect(page.locator('[data-testid="yield-state"]')).to_contain_text("no yield")
        assert httpx.get(gw.url + "/vram/yield", timeout=10).json()["state"] == "none"
        expect(lazy.locator('[data-field="state"]')).to_have_text("ready")

        # Within reach and with TTL 0: the answer says it holds until restored.
        page.locator('[data-field="min-free"]').fill("")
        page.locator('[data-action="yield"]').click()
        answer = page.locator('[data-result-slot="yield"] [data-field="result"]')
        expect(answer).to_contain_text("Yielded: freed", timeout=15_000)
        expect(answer).to_contain_text("no expiry: held until restored")
        held = httpx.get(gw.url + "/vram/yield", timeout=10).json()
        assert (held["state"], held["expires_at"]) == ("yielded", None), held
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "control-page-answer-390.png"), full_page=False)
        page.locator('[data-action="restore"]').click()
        expect(answer).to_contain_text("Restored")
        browser.close()
    # The one refusal asked for: chromium logs every 4xx a fetch got.
    expected = "the server responded with a status of 400 (Bad Request)"
    assert [p for p in problems if expected not in p] == [], "\n".join(problems)

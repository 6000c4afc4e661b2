"""The control page says where each backend sits (issue 37, item 4), in a real browser
against a gateway process on a simulated 2 x 24 GiB box: a `gpus: auto` backend that
admission places on GPU 1 is drawn in GPU 1's bar, and its card says `GPUs 1` and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_control_page import ARTIFACTS, _require_browser, ask_for, watch_console
from tests.fakes.processes import gateway_process, sim_gpu_models

pytestmark = pytest.mark.e2e


def two_gpu_models(ledger: Path) -> dict[str, Any]:
    """`sim_gpu_models` on two GPUs: pinned on GPU 0 (14,000 MiB), lazy chosen at each
    start (14,000 MiB: no room beside pinned, so GPU 1)."""
    models = sim_gpu_models(ledger, pinned_mib=14000, lazy_mib=14000)
    models["gpu"]["sim"]["count"] = 2
    models["backends"]["pinned"]["gpus"] = [0]
    models["backends"]["lazy"]["gpus"] = "auto"
    return models


def test_the_page_draws_an_auto_backend_on_the_gpu_it_was_placed_on(tmp_path: Path) -> None:
    sync_api, chromium = _require_browser()
    problems: list[str] = []
    with (
        gateway_process(two_gpu_models(tmp_path / "ledger"), wait_ready=True) as gw,
        sync_api.sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        expect = sync_api.expect
        for width in (390, 1280):
            page = browser.new_page(viewport={"width": width, "height": 900})
            watch_console(page, problems)
            page.goto(gw.url + "/ui")
            card = page.locator('[data-testid="backend-lazy"]')
            if width == 390:
                expect(card.locator('[data-field="gpus"]')).to_have_text("at its start")
                assert ask_for(gw.url, "lazy-model") == 200
            gpus = httpx.get(gw.url + "/backends").json()["backends"]
            assert {b["name"]: b["gpus"] for b in gpus} == {"pinned": [0], "lazy": [1]}
            expect(card.locator('[data-field="gpus"]')).to_have_text("1")
            expect(card.locator('[data-field="gpus"]')).to_have_attribute(
                "title", "gpus: auto: GPU 1: 24.0 GiB free, pack"
            )
            expect(card.locator('[data-field="placed-why"]')).to_have_text(
                "placed: GPU 1: 24.0 GiB free, pack"
            )
            pinned = page.locator('[data-testid="backend-pinned"]')
            expect(pinned.locator('[data-field="gpus"]')).to_have_text("0")
            expect(pinned.locator('[data-field="placed-why"]')).to_have_count(0)
            gpu0 = page.locator('[data-testid="gpu-0"]')
            gpu1 = page.locator('[data-testid="gpu-1"]')
            expect(gpu1.locator('[data-segment="lazy"]')).to_have_count(1)
            expect(gpu0.locator('[data-segment="lazy"]')).to_have_count(0)
            expect(gpu0.locator('[data-segment="pinned"]')).to_have_count(1)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"control-page-placement-{width}.png"))
            page.close()
        browser.close()
    assert problems == [], "\n".join(problems)

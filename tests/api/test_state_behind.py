"""Ending a hold always works, even when the state file cannot be written: the restore or
release takes effect in memory (the backends come back), the save is retried in the
background, and `/status` and the metrics say the file is behind until it is written.
Only new holds are refused (tests/api/test_faults.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.api.test_faults import LAZY, dir_replaced_by_a_file, disk_full, lazy_backend
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    until_backend,
)
from tests.fakes.state import saved_sections
from tests.fakes.waits import until

Fault = Callable[[Path, pytest.MonkeyPatch], str]


def repair(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo either fault: the OS call restored, the directory a directory again."""
    monkeypatch.undo()
    if state_dir.is_file():
        state_dir.unlink()
        state_dir.mkdir()


FAULTS = [
    pytest.param(dir_replaced_by_a_file, id="dir-replaced-by-a-file"),
    pytest.param(disk_full, id="disk-full"),
]


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.state_dir = tmp_path / "var"
        self.state_dir.mkdir()
        self.settings = gateway_settings(  # zones need a GPU probe: the simulated one
            {"lazy": lazy_backend(self.port)}, state_dir=self.state_dir, gpu={"probe": "sim"}
        )
        self.runtime = FakeVllmRuntime(self.port, models=[LAZY])

    def gateway(self) -> Any:
        self.runtime = FakeVllmRuntime(self.port, models=[LAZY])  # a shutdown stops the last

        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            return self.runtime

        # A failed save is retried after 0.05 s, doubling (not from 1 s): the first retry
        # after the test repairs the disk writes the file sooner.
        seams = Seams(runtime_factory=runtime_for, state_retry_first_s=0.05)
        return gateway(self.settings, seams=seams)

    def saved_zones(self) -> list[dict[str, Any]]:
        zones: list[dict[str, Any]] = saved_sections(self.state_dir).get("zones", [])
        return zones


async def served(gw: Gateway) -> int:
    return (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).status_code


async def state_status(gw: Gateway) -> dict[str, Any]:
    state: dict[str, Any] = (await gw.client.get("/status")).json()["state"]
    return state


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


async def assert_behind_then_caught_up(
    gw: Gateway,
    rig: Rig,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    os_error: str,
) -> None:
    """The file is behind (status, metrics, a warning), then the retry writes it."""
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "app.lifecycle.store" and r.levelno == logging.WARNING
    ]
    assert any("state kept in memory only" in w and os_error in w for w in warnings), warnings
    state = await state_status(gw)
    assert state["persisted"] is False
    assert str(rig.state_dir / "state.db") in state["error"]
    assert os_error in state["error"]
    text = (await gw.client.get("/metrics")).text
    assert metric(text, "microscheduler_state_save_failures_total") >= 1
    assert metric(text, "microscheduler_state_persisted") == 0

    repair(rig.state_dir, monkeypatch)

    async def persisted() -> dict[str, Any] | None:
        current = await state_status(gw)
        return current if current["persisted"] else None

    caught_up = await until(persisted, timeout_s=10, what="the state save retried")
    assert caught_up["error"] is None
    assert metric((await gw.client.get("/metrics")).text, "microscheduler_state_persisted") == 1


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_restore_works_when_the_state_cannot_be_saved(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: Fault,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        assert await served(gw) == 200
        taken = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert taken.status_code == 200, taken.text
        assert taken.json()["stopped"] == ["lazy"]
        assert [z["name"] for z in rig.saved_zones()] == ["yield"]
        yielded = (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).json()
        assert yielded["error"]["code"] == "backend_yielded"

        await gw.app.state.services.store.settled()  # saves queued before the fault
        os_error = fault(rig.state_dir, monkeypatch)
        restored = await gw.client.post("/vram/restore")
        assert restored.status_code == 200, restored.text
        assert restored.json()["state"] == "restored"
        # In effect now: no yield, and the backend serves again (started on demand).
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        assert await served(gw) == 200
        assert (await until_backend(gw, "lazy", state="ready"))["blocked_by"] == []
        # A new hold is still refused while the file cannot be written.
        refused = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert refused.status_code == 500, refused.text

        await assert_behind_then_caught_up(gw, rig, monkeypatch, caplog, os_error)
        assert rig.saved_zones() == []

    # A restart does not bring the yield back.
    async with rig.gateway() as gw:
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        assert await served(gw) == 200
        assert (await state_status(gw))["persisted"] is True


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_zone_release_works_when_the_state_cannot_be_saved(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: Fault,
) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        assert await served(gw) == 200
        # 30000 MiB needs the lazy backend's 12000: the zone evicts and blocks it.
        held = await gw.client.post("/vram/zones/img/acquire", json={"mib": 30000, "holder": "ui"})
        assert held.status_code == 200, held.text
        assert held.json()["stopped"] == ["lazy"]
        assert [z["name"] for z in rig.saved_zones()] == ["img"]
        assert await served(gw) == 503

        await gw.app.state.services.store.settled()  # saves queued before the fault
        os_error = fault(rig.state_dir, monkeypatch)
        released = await gw.client.post("/vram/zones/img/release")
        assert released.status_code == 200, released.text
        assert released.json()["released"] is True
        assert (await gw.client.get("/vram/zones")).json()["zones"] == []
        assert await served(gw) == 200

        await assert_behind_then_caught_up(gw, rig, monkeypatch, caplog, os_error)
        assert rig.saved_zones() == []

    async with rig.gateway() as gw:
        assert (await gw.client.get("/vram/zones")).json()["zones"] == []
        assert await served(gw) == 200


async def test_status_says_the_state_file_is_current(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    async with rig.gateway() as gw:
        state = await state_status(gw)
        assert state == {
            "path": str(rig.state_dir / "state.db"),
            "persisted": True,
            "error": None,
            "usage": {"pending": 0, "dropped": 0, "error": None},
        }
        text = (await gw.client.get("/metrics")).text
        assert metric(text, "microscheduler_state_save_failures_total") == 0
        assert metric(text, "microscheduler_state_persisted") == 1

"""Faults, in process: the lease after a stream the backend broke off, the state directory
unwritable at run time, the GPU probe flapping. (Upstream garbage and SIGTERM need real
sockets and a real uvicorn: tests/e2e/test_faults.py.)"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.gpu.sim import SimSource
from app.gpu.telemetry import GpuSnapshot, GpuSource, ProbeError
from app.runtimes.base import Runtime, RuntimeFailure, RuntimeStatus
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)
from tests.fakes.state import leftovers, saved_sections, sqlite_disk_full
from tests.fakes.waits import until

# -- (a) backend gone mid-stream: in-band error, [DONE], the lease released ---------------


async def test_a_stream_the_backend_breaks_off_releases_its_lease() -> None:
    async with fake_vllm(models=["m"], max_tokens=50, tokens_per_second=200) as upstream:
        settings = gateway_settings({"b": {"url": upstream.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            await upstream.set_faults(drop_after=3)
            response = await gw.client.post("/v1/chat/completions", json=chat("m", stream=True))
            assert response.status_code == 200
            events = [e for e in response.text.split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            error = json.loads(events[-2].removeprefix("data: "))["error"]
            assert error["code"] == "upstream_unavailable"
            assert "broke off the response" in error["message"]
            view = await until_backend(gw, "b", in_flight=0)
            assert view["in_flight"] == 0
            # The backend is not left busy: the next request is served.
            await upstream.set_faults(drop_after=None)
            again = await gw.client.post("/v1/chat/completions", json=chat("m"))
            assert again.status_code == 200
            metrics = (await gw.client.get("/metrics")).text
            assert 'upstream_errors_total{backend="b",kind="disconnected"} 1.0' in metrics


# -- (e) the state directory unwritable at run time ----------------------------------------

LAZY = "lazy-model"


def lazy_backend(port: int) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [LAZY],
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
        "lifecycle": "lazy",
        "vram_mib": 12000,
    }


# Three faults: the state directory read-only (chmod 0555; skipped as root, whom it does
# not stop), the directory replaced by a regular file (a path nothing can be written
# under, for any user: the case that runs as root), and a full disk, injected at the OS
# boundary (os.fsync raising ENOSPC, and sqlite3 answering SQLITE_FULL).
def read_only_dir(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 0555 does not stop writes")
    state_dir.chmod(0o555)
    return "Permission denied"


def dir_replaced_by_a_file(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    shutil.rmtree(state_dir)
    state_dir.write_text("not a directory\n")
    return "Errno"


def disk_full(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    def fsync_fails(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync_fails)
    return sqlite_disk_full(monkeypatch)


FAULTS = [
    pytest.param(read_only_dir, id="read-only-dir"),
    pytest.param(dir_replaced_by_a_file, id="dir-replaced-by-a-file"),
    pytest.param(disk_full, id="disk-full"),
]


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_zone_that_cannot_be_saved_is_refused_and_changes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[Path, pytest.MonkeyPatch], str],
) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=[LAZY])}

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    state_dir = tmp_path / "var"
    settings = gateway_settings({"lazy": lazy_backend(port)}, state_dir=state_dir)
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        kept = await gw.client.post("/vram/zones/small/acquire", json={"mib": 100, "holder": "x"})
        assert kept.status_code == 200, kept.text
        assert (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).status_code == 200
        # Read after its start, which saved what its server said it serves (and its
        # duration): saves the store queued, once they are done.
        await gw.app.state.services.store.settled()
        saved = saved_sections(state_dir)

        os_error = fault(state_dir, monkeypatch)
        # 30000 MiB needs the lazy backend's 12000: a zone that would evict it.
        refused = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 30000, "holder": "comfyui"}
        )
        monkeypatch.undo()
        if state_dir.is_dir():
            state_dir.chmod(0o755)

        assert refused.status_code == 500, refused.text
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "server_error"
        assert error["code"] == "internal_error"
        assert str(state_dir / "state.db") in error["message"]
        assert os_error in error["message"]
        # Nothing changed: the zone list, the backend (not evicted, not blocked), the file.
        zones = (await gw.client.get("/vram/zones")).json()["zones"]
        assert [z["zone"] for z in zones] == ["small"]
        view = await until_backend(gw, "lazy", state="ready")
        assert view["blocked_by"] == []
        assert runtimes["lazy"].stops == 0
        assert (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).status_code == 200
        if state_dir.is_dir():
            assert saved_sections(state_dir) == saved
            assert leftovers(state_dir) == []


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_yield_that_cannot_be_saved_is_refused_and_changes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[Path, pytest.MonkeyPatch], str],
) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=[LAZY])}

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    state_dir = tmp_path / "var"
    state_dir.mkdir()
    settings = gateway_settings({"lazy": lazy_backend(port)}, state_dir=state_dir)
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).status_code == 200
        await gw.app.state.services.store.settled()  # the start's saves, before the fault
        os_error = fault(state_dir, monkeypatch)
        refused = await gw.client.post("/vram/yield", json={"reason": "game"})
        monkeypatch.undo()
        if state_dir.is_dir():
            state_dir.chmod(0o755)

        assert refused.status_code == 500, refused.text
        error = refused.json()["error"]
        assert error["type"] == "server_error"
        assert str(state_dir / "state.db") in error["message"]
        assert os_error in error["message"]
        assert (await gw.client.get("/vram/yield")).json()["state"] != "yielded"
        view = await until_backend(gw, "lazy", state="ready")
        assert view["blocked_by"] == []
        assert runtimes["lazy"].stops == 0
        assert (await gw.client.post("/v1/chat/completions", json=chat(LAZY))).status_code == 200
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yields_total{host="local",outcome="failed"} 1.0' in metrics
        if state_dir.is_dir():
            assert leftovers(state_dir) == []


# -- (f) the state directory unusable at start: the gateway serves, holds are refused ----


async def test_a_state_store_unreadable_at_start_is_no_crash_and_is_never_overwritten(
    tmp_path: Path,
) -> None:
    # A zone saved by an earlier run; then the directory is set aside and a regular file
    # takes its place: a path nothing can be opened under, for any user (root included).
    state_dir = tmp_path / "var"
    settings = gateway_settings({"lazy": lazy_backend(free_port())}, state_dir=state_dir)
    async with gateway(settings) as gw:
        kept = await gw.client.post("/vram/zones/old/acquire", json={"mib": 100, "holder": "x"})
        assert kept.status_code == 200, kept.text
    saved = saved_sections(state_dir)
    assert "old" in json.dumps(saved["zones"])
    state_dir.rename(tmp_path / "var.away")
    state_dir.write_text("not a directory\n")

    async with gateway(settings) as gw:
        assert (await gw.client.get("/health")).status_code == 200
        state = (await gw.client.get("/status")).json()["state"]
        assert state["persisted"] is False
        assert "could not be read at start" in state["error"]
        assert str(state_dir / "state.db") in state["error"]
        metrics = (await gw.client.get("/metrics")).text
        assert "microscheduler_state_persisted 0.0" in metrics
        refused = await gw.client.post("/vram/zones/new/acquire", json={"mib": 1, "holder": "y"})
        assert refused.status_code == 500, refused.text
        assert "new holds are refused" in refused.json()["error"]["message"]
        assert (await gw.client.post("/vram/yield", json={"reason": "game"})).status_code == 500
        # The directory comes back while it runs: it is still not written (what it holds
        # was never read), and still refuses holds until a restart.
        state_dir.unlink()
        (tmp_path / "var.away").rename(state_dir)
        again = await gw.client.post("/vram/zones/new/acquire", json={"mib": 1, "holder": "y"})
        assert again.status_code == 500, again.text
    assert saved_sections(state_dir) == saved
    async with gateway(settings) as gw:  # a restart reads it
        zones = (await gw.client.get("/vram/zones")).json()["zones"]
        assert [z["zone"] for z in zones] == ["old"]


# -- (g) the GPU probe flapping: /status and metrics say so, and it recovers ----------------


class FlappingSource:
    """The simulated GPU, failing like NVML does when the driver goes away while `down`."""

    name = "sim"

    def __init__(self, inner: GpuSource) -> None:
        self.inner = inner
        self.down = False

    async def sample(self) -> GpuSnapshot:
        if self.down:
            raise ProbeError("NVML: Driver Not Loaded (test)", reason="driver_not_loaded")
        return await self.inner.sample()

    async def close(self) -> None:
        await self.inner.close()


async def test_a_flapping_gpu_probe_shows_in_status_and_metrics_and_recovers(
    tmp_path: Path,
) -> None:
    sources: list[FlappingSource] = []

    def source_for(placed: Callable[[], Mapping[int, int]]) -> GpuSource:
        sources.append(FlappingSource(SimSource(32768, 1, placed)))
        return sources[0]

    settings = gateway_settings(
        {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}},
        state_dir=tmp_path / "var",
        gpu={"probe": "sim", "poll_interval_s": 0.05},
    )
    async with gateway(settings, seams=Seams(gpu_source_factory=source_for)) as gw:

        async def gpu_status(up: bool) -> dict[str, Any] | None:
            body: dict[str, Any] = (await gw.client.get("/status")).json()["gpu"]
            return body if body["up"] is up else None

        async def probe_up_metric(value: str) -> bool:
            text = (await gw.client.get("/metrics")).text
            return f'microscheduler_gpu_probe_up{{host="local"}} {value}' in text

        first = await until(lambda: gpu_status(True))
        assert first["gpus"][0]["total_mib"] == 32768
        for _ in range(2):  # down, up, down, up
            sources[0].down = True
            down = await until(lambda: gpu_status(False))
            assert down["reason"] == "driver_not_loaded"
            assert "Driver Not Loaded" in down["error"]
            assert down["consecutive_failures"] >= 1
            assert down["gpus"], "the last good snapshot stays visible while the probe is down"
            assert await until(lambda: probe_up_metric("0.0"))
            sources[0].down = False
            up = await until(lambda: gpu_status(True))
            assert up["error"] is None
            assert up["consecutive_failures"] == 0
            assert await until(lambda: probe_up_metric("1.0"))


async def test_a_release_and_an_expiry_go_ahead_when_the_state_cannot_be_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ending a hold is never refused for a full disk (refusing kept backends blocked):
    the release and the expiry take effect here, the file catches up once it can be
    written, and the reaper lives on. (tests/api/test_state_behind.py has the rest.)"""
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=[LAZY])}

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    state_dir = tmp_path / "var"
    settings = gateway_settings(
        {"lazy": lazy_backend(port)}, state_dir=state_dir, reaper_interval_s=0.05
    )
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        body = {"mib": 100, "holder": "x"}
        assert (await gw.client.post("/vram/zones/held/acquire", json=body)).status_code == 200
        short = {**body, "ttl_s": 0.3}
        assert (await gw.client.post("/vram/zones/short/acquire", json=short)).status_code == 200
        saved = saved_sections(state_dir)

        disk_full(state_dir, monkeypatch)
        released = await gw.client.post("/vram/zones/held/release")
        assert released.status_code == 200, released.text

        async def zones() -> list[str]:
            listed = (await gw.client.get("/vram/zones")).json()["zones"]
            return sorted(z["zone"] for z in listed)

        async def none_held() -> bool:
            return await zones() == []

        assert await until(none_held)  # "held" released, "short" expired
        await gw.app.state.services.store.settled()  # their saves tried (and failed)
        assert saved_sections(state_dir) == saved  # not rewritten (disk full)
        assert (await gw.client.get("/status")).json()["state"]["persisted"] is False
        monkeypatch.undo()
        # The reaper survived the failed save: another short zone expires too, and the
        # file (saved by that acquire) holds what memory holds.
        assert (await gw.client.post("/vram/zones/again/acquire", json=short)).status_code == 200
        assert (await gw.client.get("/status")).json()["state"]["persisted"] is True
        assert await until(none_held)
        await gw.app.state.services.store.settled()  # the expiry's save, queued
        on_disk = saved_sections(state_dir)
        assert on_disk["zones"] == []
        assert leftovers(state_dir) == []


class FlappingScrapes(httpx.AsyncBaseTransport):
    """The control plane's transport: real, except that vLLM's `/metrics` is refused while
    `down` (a backend whose metrics endpoint flaps; health checks still pass)."""

    def __init__(self) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down and request.url.path == "/metrics":
            raise httpx.ConnectError("connection refused (test)", request=request)
        return await self.real.handle_async_request(request)

    async def aclose(self) -> None:
        await self.real.aclose()


async def test_a_flapping_vllm_metrics_scrape_shows_in_metrics_and_recovers(
    tmp_path: Path,
) -> None:
    transport = FlappingScrapes()
    async with fake_vllm(models=["m"]) as upstream:
        settings = gateway_settings(
            {"b": {"url": upstream.url, "models": ["m"]}},
            state_dir=tmp_path / "var",
            gpu={"probe": "sim", "poll_interval_s": 0.05},
            health_interval_s=0.05,
        )
        async with gateway(settings, seams=Seams(control_transport=transport)) as gw:

            async def scrape_up(value: str) -> str | None:
                text = (await gw.client.get("/metrics")).text
                up = f'microscheduler_backend_metrics_up{{backend="b"}} {value}' in text
                return text if up else None

            text = await until(lambda: scrape_up("1.0"))
            assert 'microscheduler_backend_kv_cache_usage_ratio{backend="b"}' in text
            for _ in range(2):
                transport.down = True
                text = await until(lambda: scrape_up("0.0"))
                # No stale load is shown while the scrape fails.
                assert 'microscheduler_backend_kv_cache_usage_ratio{backend="b"}' not in text
                assert (await gw.client.post("/v1/chat/completions", json=chat("m"))).is_success
                transport.down = False
                text = await until(lambda: scrape_up("1.0"))
                assert 'microscheduler_backend_kv_cache_usage_ratio{backend="b"}' in text


# -- (f) the Docker proxy down while a container backend is ready ---------------------------
# (A cold wake while the proxy is down, and the recovery, run against the real engine and
# haproxy: tests/e2e/test_docker_lifecycle.py::test_proxy_down_gives_503_and_the_gateway_
# recovers_when_it_returns.)


class ProxyFlappingRuntime(FakeVllmRuntime):
    """A container runtime whose Docker API (the socket proxy) goes away while `down`:
    the server itself keeps running, only `status()` cannot be answered."""

    kind = "docker"
    proxy = "http://127.0.0.1:2375"
    down = False

    async def status(self) -> RuntimeStatus:
        if self.down:
            raise RuntimeFailure(
                f"cannot reach the Docker API at {self.proxy}: ConnectError (is the proxy up?)"
            )
        status = await super().status()
        return RuntimeStatus(True, None, "running") if status.running else status


async def test_a_proxy_outage_does_not_take_a_ready_container_backend_out(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtime = ProxyFlappingRuntime(port, models=["m"])
    backend = {
        "url": f"http://127.0.0.1:{port}",
        "models": ["m"],
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
    }
    settings = gateway_settings({"b": backend}, state_dir=tmp_path / "var", health_interval_s=0.05)
    seams = Seams(runtime_factory=lambda name, config: runtime)
    async with gateway(settings, seams=seams) as gw:
        await until_backend(gw, "b", state="ready", runtime_detail="running")
        for _ in range(2):
            runtime.down = True
            view = await until_runtime_detail(gw, "unknown: ")
            assert runtime.proxy in view["runtime_detail"]
            assert view["state"] == "ready"
            served = await gw.client.post("/v1/chat/completions", json=chat("m"))
            assert served.status_code == 200, served.text
            runtime.down = False
            await until_backend(gw, "b", state="ready", runtime_detail="running")
        assert runtime.starts == 1
        assert runtime.stops == 0


async def until_runtime_detail(gw: Gateway, prefix: str) -> dict[str, Any]:
    async def seen() -> dict[str, Any] | None:
        views = (await gw.client.get("/backends")).json()["backends"]
        view: dict[str, Any] = next(v for v in views if v["name"] == "b")
        return view if str(view["runtime_detail"]).startswith(prefix) else None

    return await until(seen)

"""Lazy wake, zones, idle stop and the admin API, with the gateway and fake vLLM servers
in process (the fake runtime opens a real port on 127.0.0.1 when the test says so)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway, gateway, gateway_settings, until_backend
from tests.fakes.waits import until

CHAT = {"model": "lazy-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def lazy(port: int, **fields: Any) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["lazy-model"],
        "runtime": {"kind": "process", "command": ["unused: the test's runtime runs it"]},
        "lifecycle": "lazy",
        "vram_mib": 12000,
        **fields,
    }


def pinned(port: int, **fields: Any) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": ["pinned-model"],
        "runtime": {"kind": "process", "command": ["unused"]},
        "vram_mib": 16000,
        "priority": 90,
        **fields,
    }


@asynccontextmanager
async def lifecycle_gateway(
    backends: dict[str, dict[str, Any]],
    runtimes: dict[str, FakeVllmRuntime],
    tmp_path: Path,
    **fields: Any,
) -> AsyncIterator[Gateway]:
    """The gateway over `runtimes` on the simulated GPU (`probe: sim`, 32 GiB, said here:
    the default probe is `auto`, no GPU on a machine without NVML) unless `gpu=` says."""

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    fields = {"gpu": {"probe": "sim"}, **fields}
    settings = gateway_settings(backends, state_dir=tmp_path / "var", **fields)
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        yield gw


async def backend_state(gw: Gateway, name: str) -> dict[str, Any]:
    response = await gw.client.get("/backends")
    assert response.status_code == 200
    views: list[dict[str, Any]] = response.json()["backends"]
    return next(v for v in views if v["name"] == name)


async def hold_zone_across_a_restart(port: int, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """A first gateway wakes the lazy backend, then a zone evicts it; returns the config."""
    backends = {"lazy": lazy(port)}
    first = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway(backends, first, tmp_path) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        acquired = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 30000, "holder": "comfyui"}
        )
        assert acquired.json()["stopped"] == ["lazy"]
    return backends


async def test_a_cold_request_wakes_a_lazy_backend_and_is_answered(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        assert (await backend_state(gw, "lazy"))["state"] == "stopped"
        assert runtime.starts == 0  # lazy: nothing started with the gateway
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=CHAT))
        view = await until_backend(gw, "lazy", waiting=1)
        assert view["state"] == "starting"
        assert view["waiting"] == 1
        await asyncio.sleep(0.3)  # the port stays closed this long: last_start_s measures it
        runtime.listening.set()
        response = await request
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"
        view = await backend_state(gw, "lazy")
        assert view["state"] == "ready"
        assert view["last_start_s"] >= 0.3
        assert runtime.starts == 1
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_starts_total{backend="lazy",outcome="ready"} 1.0' in metrics
        assert 'microscheduler_backend_state{backend="lazy",state="ready"} 1.0' in metrics


async def test_a_held_streaming_request_gets_wake_comments_then_the_stream(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway(
        {"lazy": lazy(port)}, {"lazy": runtime}, tmp_path, wake_notice_s=0.1
    ) as gw:
        views: list[dict[str, Any]] = []

        async def open_later() -> None:
            await until_backend(gw, "lazy", waiting=1)  # the request is held
            await asyncio.sleep(0.35)  # the thing under test: wake_notice_s passes 3 times
            views.append(await backend_state(gw, "lazy"))
            runtime.listening.set()

        opener = asyncio.create_task(open_later())
        response = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await opener
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    comments = [line for line in text.splitlines() if line.startswith(": waking")]
    assert len(comments) >= 2
    assert comments[0].startswith(": waking lazy ")
    # A start that waits says why, in the comments and in /backends, not a silent wait:
    # its server not listening yet is progress, not an error (every start goes through it).
    assert views[0]["health_error"] is None, views[0]
    assert views[0]["upstream_error"] is None, views[0]
    why = f"waiting for the server to listen on http://127.0.0.1:{port}/health (refused for "
    refused = [comment for comment in comments if why in comment]
    assert refused, comments
    assert refused[-1].endswith("s); the process is running)")
    assert views[0]["starting"].startswith(why)
    assert text.index(": waking") < text.index("data: {")
    assert text.rstrip().endswith("data: [DONE]")


async def test_a_start_asking_its_server_what_it_serves_says_so(tmp_path: Path) -> None:
    """Healthy but not ready yet: the real vLLM builds its /openapi.json schema (0.6 to 3 s
    on its first call); /status and the wake comments say what the start waits for."""
    port = free_port()
    learning = asyncio.Event()
    runtime = FakeVllmRuntime(port, models=["lazy-model"], learn_gate=learning)
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=CHAT))
        await asyncio.wait_for(runtime.learning.wait(), 5)  # healthy, its routes asked
        view = await backend_state(gw, "lazy")
        learning.set()
        response = await request
    assert response.status_code == 200
    assert view["state"] == "starting"
    assert view["starting"].startswith(
        f"health check to http://127.0.0.1:{port}/health passes; asking what it serves "
        "(/openapi.json, /v1/models) for "
    ), view["starting"]


async def test_a_wake_that_fails_after_the_comments_ends_the_stream_in_band(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway(
        {"lazy": lazy(port, max_wait_s=0.35)}, {"lazy": runtime}, tmp_path, wake_notice_s=0.1
    ) as gw:
        response = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        entry = await newest_activity(gw)
    assert response.status_code == 200  # committed by the first comment
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "backend_wake_timeout"
    # Recorded as what went out (200) and how it ended.
    assert (entry["status"], entry["stream_error"]) == (200, "backend_wake_timeout")
    assert "still starting after 0.35s (max_wait_s)" in error["message"]


async def test_an_upstream_error_after_the_wake_comments_is_sent_in_band(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(
        port, open_at_start=False, models=["lazy-model"], fail_status=500, fail_count=1
    )
    async with lifecycle_gateway(
        {"lazy": lazy(port)}, {"lazy": runtime}, tmp_path, wake_notice_s=0.1
    ) as gw:

        async def open_later() -> None:
            await until_backend(gw, "lazy", waiting=1)  # the request is held
            await asyncio.sleep(0.25)  # the thing under test: at least one wake comment
            runtime.listening.set()

        opener = asyncio.create_task(open_later())
        response = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await opener
        entry = await newest_activity(gw)
    assert (entry["status"], entry["stream_error"]) == (200, "upstream_500")
    assert response.status_code == 200  # committed by the first comment
    assert response.text.startswith(": waking lazy ")
    events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == 500  # the upstream's own error object, passed on
    assert error["type"] == "InternalServerError"


async def newest_activity(gw: Gateway) -> dict[str, Any]:
    response = await gw.client.get("/activity", params={"limit": 1})
    assert response.status_code == 200
    entry: dict[str, Any] = response.json()["entries"][0]
    return entry


async def test_a_non_streaming_request_that_waits_too_long_gets_504(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway(
        {"lazy": lazy(port, max_wait_s=0.2)}, {"lazy": runtime}, tmp_path
    ) as gw:
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 504
    assert response.headers["retry-after"] == "10"
    assert response.json()["error"]["code"] == "backend_wake_timeout"


async def test_zone_acquire_evicts_and_requests_during_the_hold_do_not_wake(
    tmp_path: Path,
) -> None:
    lazy_port, pinned_port = free_port(), free_port()
    runtimes = {
        "lazy": FakeVllmRuntime(lazy_port, models=["lazy-model"]),
        "pinned": FakeVllmRuntime(pinned_port, models=["pinned-model"]),
    }
    backends = {"lazy": lazy(lazy_port), "pinned": pinned(pinned_port)}
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await gw.client.post("/backends/pinned/start")
        # 32768 total: pinned 16000 + lazy 12000 leave 4768; 12000 more needs the lazy one.
        response = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 12000, "holder": "comfyui", "ttl_s": 600}
        )
        assert response.status_code == 200, response.text
        grant = response.json()
        assert grant["granted"] is True
        assert grant["stopped"] == ["lazy"]
        assert grant["freed_mib"] == 12000
        assert grant["free_mib"] == 32768 - 16000 - 12000
        assert runtimes["lazy"].stops == 1

        blocked = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert blocked.status_code == 503
        error = blocked.json()["error"]
        assert error["code"] == "backend_blocked"
        assert "VRAM zone 'img' (held by 'comfyui'" in error["message"]
        assert blocked.headers["retry-after"] == "600"  # the zone's ttl_s: when it ends
        assert runtimes["lazy"].starts == 1  # the request did not wake it
        assert (await backend_state(gw, "lazy"))["blocked_by"] != []

        zones = (await gw.client.get("/vram/zones")).json()
        assert [z["zone"] for z in zones["zones"]] == ["img"]
        assert zones["gpus"][0]["used_mib"] == 16000 + 12000

        released = await gw.client.post("/vram/zones/img/release")
        assert released.status_code == 200
        assert released.json()["unblocked"] == ["lazy"]
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert runtimes["lazy"].starts == 2
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_stops_total{backend="lazy",reason="zone"} 1.0' in metrics


async def test_a_zone_that_cannot_be_freed_is_refused_with_what_holds_the_memory(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtimes = {"pinned": FakeVllmRuntime(port, models=["pinned-model"])}
    async with lifecycle_gateway({"pinned": pinned(port)}, runtimes, tmp_path) as gw:
        await gw.client.post("/backends/pinned/start")
        response = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 20000, "holder": "comfyui"}
        )
        assert response.status_code == 409
        message = response.json()["error"]["message"]
        assert "backend pinned 16000 MiB (pinned)" in message
        assert (await backend_state(gw, "pinned"))["state"] == "ready"
        assert (await gw.client.get("/vram/zones")).json()["zones"] == []


async def test_a_second_holder_gets_409_and_the_same_holder_renews(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway({"lazy": lazy(port)}, runtimes, tmp_path) as gw:
        body = {"mib": 1000, "holder": "comfyui", "ttl_s": 60}
        assert (await gw.client.post("/vram/zones/img/acquire", json=body)).status_code == 200
        renewed = await gw.client.post("/vram/zones/img/acquire", json={**body, "ttl_s": 600})
        assert renewed.status_code == 200
        assert renewed.json()["renewed"] is True
        assert renewed.json()["expires_in_s"] > 500
        other = await gw.client.post("/vram/zones/img/acquire", json={**body, "holder": "game"})
        assert other.status_code == 409
        assert "already held" in other.json()["error"]["message"]


async def test_zone_requests_are_validated_in_the_openai_envelope(tmp_path: Path) -> None:
    port = free_port()
    runtimes = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway({"lazy": lazy(port)}, runtimes, tmp_path) as gw:
        bad = await gw.client.post("/vram/zones/img/acquire", json={"mib": -5, "holder": "x"})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "mib"
        no_gpu = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 5, "holder": "x", "gpu": 3}
        )
        assert no_gpu.status_code == 400
        assert "GPU 3 is not present" in no_gpu.json()["error"]["message"]
        unknown = await gw.client.post("/vram/zones/nope/release")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "zone_not_found"
        assert (await gw.client.get("/vram/zones")).json()["zones"] == []


async def test_zones_survive_a_gateway_restart(tmp_path: Path) -> None:
    port = free_port()
    backends = await hold_zone_across_a_restart(port, tmp_path)
    second = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    async with lifecycle_gateway(backends, second, tmp_path) as gw:
        zones = (await gw.client.get("/vram/zones")).json()["zones"]
        assert [(z["zone"], z["holder"], z["blocks"]) for z in zones] == [
            ("img", "comfyui", ["lazy"])
        ]
        blocked = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert blocked.json()["error"]["code"] == "backend_blocked"
        assert second["lazy"].starts == 0


async def test_an_idle_lazy_backend_is_stopped_after_its_ttl(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    async with lifecycle_gateway(
        {"lazy": lazy(port, idle_ttl_s=0.3)}, {"lazy": runtime}, tmp_path, reaper_interval_s=0.05
    ) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        view = await until_backend(gw, "lazy", state="stopped")
        assert view["state"] == "stopped"
        assert "idle" in view["reason"]
        assert runtime.stops == 1
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_backend_stops_total{backend="lazy",reason="idle"} 1.0' in metrics


async def test_admin_stop_drains_and_the_next_request_wakes_it(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        started = await gw.client.post("/backends/lazy/start")
        assert started.status_code == 200
        assert started.json()["state"] == "ready"
        stopped = await gw.client.post("/backends/lazy/stop")
        assert stopped.json()["state"] == "stopped"
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert runtime.starts == 2
        missing = await gw.client.post("/backends/nope/stop")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "backend_not_found"


async def test_admission_refusal_is_a_503_naming_the_holders(tmp_path: Path) -> None:
    lazy_port, pinned_port = free_port(), free_port()
    runtimes = {
        "lazy": FakeVllmRuntime(lazy_port, models=["lazy-model"]),
        "pinned": FakeVllmRuntime(pinned_port, models=["pinned-model"]),
    }
    backends = {"lazy": lazy(lazy_port, vram_mib=20000), "pinned": pinned(pinned_port)}
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        await gw.client.post("/backends/pinned/start")
        response = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "backend_no_vram"
        assert "backend pinned 16000 MiB (pinned)" in error["message"]
        assert runtimes["lazy"].starts == 0


async def test_admin_routes_need_admin_rights(tmp_path: Path) -> None:
    port = free_port()
    settings = gateway_settings({"lazy": lazy(port)}, state_dir=tmp_path)
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    seams = Seams(runtime_factory=lambda name, cfg: runtime)
    async with gateway(settings, seams=seams, client_host="10.0.0.8") as gw:
        for method, path in [
            ("GET", "/backends"),
            ("POST", "/backends/lazy/start"),
            ("GET", "/vram/zones"),
            ("POST", "/vram/zones/img/release"),
        ]:
            response = await gw.client.request(method, path)
            assert response.status_code == 403, path
    assert runtime.starts == 0


async def test_ready_ignores_stopped_lazy_backends(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        response = await gw.client.get("/ready")
    assert response.status_code == 200
    assert response.json()["backends"]["lazy"]["ready"] is False


async def test_a_running_lazy_backend_is_adopted_at_start_up(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    await runtime.start()  # it outlived an earlier gateway
    try:
        async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
            view = await until_backend(gw, "lazy", state="ready")
            assert view["state"] == "ready"
            assert view["holds_vram"] is True
            assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert runtime.stops == 0
    finally:
        await runtime.stop()


async def test_a_running_backend_that_a_saved_zone_blocks_is_stopped_at_start_up(
    tmp_path: Path,
) -> None:
    port = free_port()
    backends = await hold_zone_across_a_restart(port, tmp_path)
    second = {"lazy": FakeVllmRuntime(port, models=["lazy-model"])}
    await second["lazy"].start()  # someone started it by hand while the gateway was down
    async with lifecycle_gateway(backends, second, tmp_path) as gw:
        # It starts out stopped: wait for the adoption's stop itself.
        await until(lambda: second["lazy"].stops, what="the adoption to stop it")
        assert second["lazy"].stops == 1
        view = await until_backend(gw, "lazy", state="stopped")
        assert view["state"] == "stopped"
        assert view["blocked_by"] != []
        blocked = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert blocked.json()["error"]["code"] == "backend_blocked"


async def test_a_lazy_backend_without_vram_mib_is_admitted_on_its_planned_footprint(
    tmp_path: Path,
) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    config = lazy(
        port, model_info={"catalog": "qwen3-8b", "max_model_len": 8192, "max_num_seqs": 4}
    )
    del config["vram_mib"]
    async with lifecycle_gateway({"lazy": config}, {"lazy": runtime}, tmp_path) as gw:
        status = (await gw.client.get("/status")).json()
        vram = status["backends"][0]["vram"]
        assert vram["configured_mib"] is None
        assert vram["footprint"]["source"] == "planner"
        planned = vram["admission_mib"]
        # qwen3-8b bf16 at 8192 tokens on a 32 GiB GPU: ~15.6 GiB of weights and 1.1 GiB of
        # KV, one request of 8192 tokens (vLLM's minimum; max_num_seqs 4 does not multiply it).
        assert 18000 < planned < 21000
        # Leave one MiB less than that free: the wake is refused, naming the zone.
        held = 32768 - planned + 1
        acquired = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": held, "holder": "x"}
        )
        assert acquired.status_code == 200
        refused = await gw.client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "backend_no_vram"
        assert f"needs {planned} MiB on GPU 0" in refused.json()["error"]["message"]
        assert runtime.starts == 0
        await gw.client.post("/vram/zones/img/release")
        assert (await gw.client.post("/v1/chat/completions", json=CHAT)).status_code == 200

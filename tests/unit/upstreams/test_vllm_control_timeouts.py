"""The wait for sleep-mode calls to a local vLLM: per backend, scaled by the size of its
weights unless `timeouts.control_s` sets it, and told to `/collective_rpc`.

httpx hands each request's timeout to its transport (`request.extensions["timeout"]`), so
the fake server below sees the wait of every call without any sleeping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.services import Seams, Services
from app.settings import BackendConfig, Settings
from app.upstreams.vllm import (
    CALL_TIMEOUT_S,
    RPC_ANSWER_MARGIN_S,
    VllmClient,
    control_timeout_s,
)
from tests.fakes.servers import seams_for_tests

GIB = 1024**3
BASE = "http://vllm:8000"


def test_the_control_timeout_grows_with_the_weights_unless_set() -> None:
    assert control_timeout_s(None, None) == CALL_TIMEOUT_S == 60.0
    assert control_timeout_s(None, 15 * GIB) == 60.0 + 150.0  # an 8B model in bf16
    assert control_timeout_s(None, 130 * GIB) == 60.0 + 1300.0  # a 70B model in bf16
    assert control_timeout_s(900.0, 130 * GIB) == 900.0  # timeouts.control_s wins


def test_the_weights_come_from_the_description_else_the_footprint() -> None:
    def config(**fields: Any) -> BackendConfig:
        return BackendConfig(url=BASE, models=["m"], **fields)

    described = config(model_info={"catalog": "llama-3.1-70b"})
    assert described.weights_bytes is not None
    assert 125 * GIB < described.weights_bytes < 140 * GIB  # 70.6 B parameters in bf16
    given = config(model_info={"catalog": "llama-3.1-70b", "weights_gib": 40})
    assert given.weights_bytes == 40 * GIB  # a quantized checkpoint, as given
    assert config(vram_mib=8192, gpus=[0, 1]).weights_bytes == 16 * GIB
    assert config().weights_bytes is None


async def test_each_backend_gets_its_own_control_timeout(tmp_path: Path) -> None:
    external = {"kind": "external"}
    settings = Settings(
        backends={
            "big": {"url": "http://127.0.0.1:9", "models": ["big"], "runtime": external,
                    "model_info": {"catalog": "llama-3.1-70b"}},
            "sized": {"url": "http://127.0.0.1:9", "models": ["sized"], "runtime": external,
                      "vram_mib": 20480},
            "set": {"url": "http://127.0.0.1:9", "models": ["set"], "runtime": external,
                    "vram_mib": 20480, "timeouts": {"control_s": 45}},
            "plain": {"url": "http://127.0.0.1:9", "models": ["plain"], "runtime": external},
        },
        state_dir=tmp_path,
        access_log=False,
    )  # fmt: skip
    services = Services(settings, Metrics(), seams_for_tests(Seams()))
    try:
        waits = {name: b.server.vllm.timeout_s for name, b in services.backends.items()}
    finally:
        await services.close()
    assert waits["big"] > 1300.0  # minutes: a level-2 wake reads ~131 GiB from disk
    assert waits["sized"] == 60.0 + 200.0
    assert waits["set"] == 45.0
    assert waits["plain"] == 60.0
    # A gateway-wide value applies to every backend that does not set its own.
    everywhere = Settings(
        backends=settings.model_dump(by_alias=True)["backends"],
        timeouts={"control_s": 120},
        state_dir=tmp_path,
        access_log=False,
    )
    assert everywhere.backend_timeouts("big").control_s == 120.0
    assert everywhere.backend_timeouts("set").control_s == 45.0


class RecordingServer:
    """vLLM's sleep-mode routes, all 200 (asleep after `/sleep`, awake after a wake);
    records each call's path, body and the read timeout the client gave it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, float]] = []
        self.asleep = True

    def __call__(self, request: httpx.Request) -> httpx.Response:
        read = request.extensions["timeout"]["read"]
        self.calls.append((request.url.path, request.content, read))
        if request.url.path == "/is_sleeping":
            return httpx.Response(200, json={"is_sleeping": self.asleep})
        if request.url.path in ("/sleep", "/wake_up"):
            self.asleep = request.url.path == "/sleep"
        return httpx.Response(200)


@pytest.mark.parametrize("level", [2, None])
async def test_the_reload_is_told_the_timeout_and_every_call_waits_it(level: int | None) -> None:
    server = RecordingServer()
    wait = control_timeout_s(None, 130 * GIB)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        await VllmClient(client, BASE, timeout_s=wait).wake_up(level=level)
    waits = {path: read for path, _, read in server.calls}
    assert waits == {
        "/wake_up": wait,
        # A little longer than the server's own deadline, so its error answer comes first.
        "/collective_rpc": wait + RPC_ANSWER_MARGIN_S,
        "/reset_prefix_cache": wait,
        "/is_sleeping": wait,
    }
    (rpc,) = [body for path, body, _ in server.calls if path == "/collective_rpc"]
    # vllm/entrypoints/serve/dev/rpc/api_router.py (0.33) reads `method` and `timeout`.
    assert json.loads(rpc) == {"method": "reload_weights", "timeout": wait}


async def test_sleep_and_a_plain_wake_wait_the_backends_timeout() -> None:
    server = RecordingServer()
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        control = VllmClient(client, BASE, timeout_s=777.0)
        await control.sleep(1)
        await control.wake_up(level=1)
    assert [path for path, _, _ in server.calls] == [
        "/sleep", "/is_sleeping", "/wake_up", "/is_sleeping",
    ]  # fmt: skip
    assert {read for _, _, read in server.calls} == {777.0}

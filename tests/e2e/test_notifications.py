"""Notifications of a real gateway process to a webhook receiver on 127.0.0.1: the yield
and the restore arrive (JSON and ntfy formats), a 500 is retried, and a target's URL is
never shown."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.fakes.processes import fake_vllm_process, gateway_process
from tests.fakes.waits import until

pytestmark = pytest.mark.e2e


class Receiver:
    """A webhook receiver: answers 500 to the first `fail_first` posts, then 200."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.posts.append((request.path, dict(request.headers), await request.read()))
        if len(self.posts) <= self.fail_first:
            return web.Response(status=500)
        return web.Response(status=200)

    def bodies(self, path: str) -> list[bytes]:
        return [body for p, _, body in self.posts if p == path]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver(fail_first=1)
    app = web.Application()
    app.router.add_post("/{tail:.*}", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found.url = f"http://127.0.0.1:{port}"
    yield found
    await runner.cleanup()


async def test_yield_and_restore_are_posted_and_a_500_is_retried(receiver: Receiver) -> None:
    with fake_vllm_process("m") as upstream:
        config: dict[str, Any] = {
            "backends": {"b": {"url": upstream, "models": ["m"]}},
            "notify": [
                {"url": receiver.url + "/hook", "events": ["yield", "restore"]},
                {"url_env": "NTFY_URL", "format": "ntfy", "events": ["yield"]},
            ],
        }
        env = {"NTFY_URL": receiver.url + "/secret-topic"}
        with gateway_process(config, env=env) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
                assert (await client.post("/vram/yield", json={"reason": "game"})).is_success
                assert (await client.post("/vram/restore")).is_success

                def both() -> bool | None:
                    hooks = [b for b in receiver.bodies("/hook") if b]
                    # The first post got a 500: it came again.
                    return len(hooks) >= 3 and len(receiver.bodies("/secret-topic")) >= 1

                await until(both, what="yield (retried) and restore posted", timeout_s=20)
                status = (await client.get("/status")).json()
                metrics = (await client.get("/metrics")).text
    hooks = [json.loads(b) for b in receiver.bodies("/hook")]
    assert hooks[0]["event"] == hooks[1]["event"] == "yield"  # the retry of the 500
    assert hooks[0]["reason"] == "game"
    assert hooks[2]["event"] == "restore"
    ntfy = [(h, b) for p, h, b in receiver.posts if p == "/secret-topic"]
    headers, body = ntfy[0]
    assert headers["Title"] == "microscheduler: yield"
    assert headers["Tags"] == "arrow_down"
    assert body.decode().startswith("yield: ")
    targets = status["notifications"]["targets"]
    assert [t["sent"] for t in targets] == [2, 1]
    assert targets[0]["host"] == "127.0.0.1"
    assert "secret-topic" not in str(status)
    assert 'microscheduler_notifications_total{result="retried"} 1.0' in metrics
    assert 'microscheduler_notifications_total{result="sent"} 3.0' in metrics


async def test_a_notification_that_comes_back_to_the_gateway_is_refused() -> None:
    # A target that is the gateway by another name (here: through a proxy that forwards
    # each post to its /config/reload) would reload, notify `config_reloaded`, and loop.
    forwarded: list[int] = []
    gateway_url = ""

    async def proxy(request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                gateway_url + "/config/reload", content=await request.read(), headers=headers
            )
        forwarded.append(answer.status_code)
        return web.Response(status=answer.status_code, body=answer.content)

    app = web.Application()
    app.router.add_post("/{tail:.*}", proxy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with fake_vllm_process("m") as upstream:
            config: dict[str, Any] = {
                "backends": {"b": {"url": upstream, "models": ["m"]}},
                "notify": [{"url": f"http://127.0.0.1:{port}/hook"}],
            }
            with gateway_process(config) as gw:
                gateway_url = gw.url
                async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
                    assert (await client.post("/vram/yield", json={"reason": "game"})).is_success
                    await until(lambda: forwarded or None, what="the yield's post forwarded")
                    status = (await client.get("/status")).json()
    finally:
        await runner.cleanup()
    assert forwarded[0] == 403
    assert status["config"]["source"] == "startup"  # never reloaded
    (target,) = status["notifications"]["targets"]
    assert target["failed"] >= 1
    assert target["sent"] == 0

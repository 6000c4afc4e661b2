"""The vLLM client: sleep mode against the fake vLLM (which offers it only in dev mode) and
step by step through respx (the wake after each level), and the health check."""

from __future__ import annotations

import httpx
import pytest
import respx

from app.upstreams.vllm import ControlError, ControlTimeout, SleepUnsupported, VllmClient
from tests.fakes.processes import free_port
from tests.fakes.servers import fake_vllm

PROMPT = {"model": "fake-model", "prompt": "alpha beta", "max_tokens": 2}


async def test_sleep_and_wake_are_confirmed_by_is_sleeping() -> None:
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        control = VllmClient(client, server.url)
        assert await control.is_sleeping() is False
        await control.sleep(1)
        assert await control.is_sleeping() is True
        await control.wake_up(level=1)
        assert await control.is_sleeping() is False
        assert (await server.client.post("/v1/completions", json=PROMPT)).status_code == 200


@pytest.mark.parametrize("known", [2, None])
async def test_a_level_2_wake_reloads_the_weights(known: int | None) -> None:
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        control = VllmClient(client, server.url)
        await control.sleep(2)
        await control.wake_up(level=known)  # None: found asleep, the level is not known
        assert await control.is_sleeping() is False
        answer = await server.client.post("/v1/completions", json=PROMPT)
        assert answer.status_code == 200, answer.text
        assert (await server.stats())["failed"] == 0


async def test_a_plain_wake_after_level_2_leaves_the_weights_discarded() -> None:
    """What the gateway did before: the fake answers 500 (a real vLLM answers garbage)."""
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        control = VllmClient(client, server.url)
        await control.sleep(2)
        await control.wake_up(level=1)  # the wrong level: a plain wake
        answer = await server.client.post("/v1/completions", json=PROMPT)
        assert answer.status_code == 500
        assert "discarded by a level-2 sleep" in answer.json()["error"]["message"]


BASE = "http://vllm:8000"
LEVEL_2_WAKE = [
    ("/wake_up", "tags=weights", b""),
    ("/collective_rpc", "", b'{"method":"reload_weights","timeout":60.0}'),
    ("/wake_up", "tags=kv_cache", b""),
    ("/reset_prefix_cache", "", b""),
]


def sleep_mode_routes(mock: respx.MockRouter, failing: str | None = None) -> respx.Route:
    """The wake's routes, all 200 but `failing` (a path and query: 500); `/is_sleeping`
    says awake."""
    for path, query, _ in LEVEL_2_WAKE:
        status = 500 if failing == f"{path}?{query}" else 200
        mock.post(f"{BASE}{path}" + (f"?{query}" if query else "")).respond(status, text="boom")
    mock.post(f"{BASE}/wake_up").respond(200)
    return mock.get(f"{BASE}/is_sleeping").respond(200, json={"is_sleeping": False})


@pytest.mark.parametrize("level", [0, 1, 2, None])  # 0: found paused (its weights stay)
async def test_the_wake_sends_the_steps_of_its_level_in_order(level: int | None) -> None:
    async with respx.mock(assert_all_called=False) as mock, httpx.AsyncClient() as client:
        confirm = sleep_mode_routes(mock)
        await VllmClient(client, BASE, headers={"Authorization": "Bearer k"}).wake_up(level=level)
        calls = list(mock.calls)  # respx forgets them on leaving the context
    sent = [
        (call.request.url.path, call.request.url.query.decode(), call.request.content)
        for call in calls
        if call.request.url.path != "/is_sleeping"
    ]
    assert sent == ([("/wake_up", "", b"")] if level in (0, 1) else LEVEL_2_WAKE)
    assert all(call.request.headers["authorization"] == "Bearer k" for call in calls)
    assert calls[-1].request.url.path == "/is_sleeping"  # confirmed awake after the last step
    assert confirm.called


@pytest.mark.parametrize("failing", [f"{path}?{query}" for path, query, _ in LEVEL_2_WAKE])
async def test_a_failing_step_of_the_level_2_wake_raises_and_stops_there(failing: str) -> None:
    async with respx.mock(assert_all_called=False) as mock, httpx.AsyncClient() as client:
        confirm = sleep_mode_routes(mock, failing)
        with pytest.raises(ControlError) as info:
            await VllmClient(client, BASE).wake_up(level=2)
        last = mock.calls.last.request.url.path
    path = failing.split("?")[0]
    assert f"POST {path} answered 500: boom" in str(info.value)
    assert not isinstance(info.value, SleepUnsupported)
    assert last == path  # no step after the failing one
    assert not confirm.called


async def test_a_wake_that_does_not_end_awake_raises() -> None:
    async with respx.mock(assert_all_called=False) as mock, httpx.AsyncClient() as client:
        sleep_mode_routes(mock)
        mock.get(f"{BASE}/is_sleeping").respond(200, json={"is_sleeping": True})
        with pytest.raises(ControlError) as info:
            await VllmClient(client, BASE, timeout_s=0.2).wake_up(level=2)
    assert "did not report awake" in str(info.value)


async def test_a_server_without_dev_mode_says_how_to_enable_sleep_mode() -> None:
    async with fake_vllm(dev_mode=False) as server, httpx.AsyncClient() as client:
        with pytest.raises(SleepUnsupported) as info:
            await VllmClient(client, server.url).sleep(1)
    assert "404" in str(info.value)
    assert "VLLM_SERVER_DEV_MODE=1" in str(info.value)


async def test_an_invalid_level_is_a_control_error_with_the_servers_answer() -> None:
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        with pytest.raises(ControlError) as info:
            await VllmClient(client, server.url).sleep(7)
    assert not isinstance(info.value, SleepUnsupported)
    assert "answered 400" in str(info.value)


async def test_a_server_that_is_not_there_is_a_control_error() -> None:
    async with httpx.AsyncClient() as client:
        control = VllmClient(client, f"http://127.0.0.1:{free_port()}", timeout_s=1)
        with pytest.raises(ControlError) as info:
            await control.wake_up(level=None)
    assert "POST /wake_up: ConnectError" in str(info.value)


async def test_health_is_none_when_the_server_answers_200_else_why_not() -> None:
    async with fake_vllm() as server, httpx.AsyncClient() as client:
        assert await VllmClient(client, server.url).health() is None
        missing = await VllmClient(client, server.url, health_path="/nope").health()
    assert missing == "health answered 404"


async def test_health_of_a_server_that_is_not_there_names_the_error() -> None:
    async with httpx.AsyncClient() as client:
        error = await VllmClient(client, f"http://127.0.0.1:{free_port()}").health()
    assert error is not None
    assert error.startswith("ConnectError")


async def test_a_wake_without_an_answer_is_a_control_timeout() -> None:
    """Told apart from a wake that answered an error (the sleep guard's `wake_timeout`)."""

    def hangs(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(hangs)) as client:
        control = VllmClient(client, BASE, timeout_s=7.0)
        with pytest.raises(ControlTimeout, match=r"POST /wake_up: no answer within 7s"):
            await control.wake_up(level=1)


async def test_a_wake_answered_500_is_a_control_error_not_a_timeout() -> None:
    def fails(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "Call to wake_up method failed"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(fails)) as client:
        with pytest.raises(ControlError, match="answered 500") as raised:
            await VllmClient(client, BASE).wake_up(level=1)
        assert not isinstance(raised.value, ControlTimeout)

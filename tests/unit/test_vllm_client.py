"""The vLLM client: sleep mode against the fake vLLM (which offers it only in dev mode), and
the health check."""

from __future__ import annotations

import httpx
import pytest

from app.upstreams.vllm import ControlError, SleepUnsupported, VllmClient
from tests.fakes.processes import free_port
from tests.fakes.servers import fake_vllm


async def test_sleep_and_wake_are_confirmed_by_is_sleeping() -> None:
    async with fake_vllm(dev_mode=True) as server, httpx.AsyncClient() as client:
        control = VllmClient(client, server.url)
        assert await control.is_sleeping() is False
        await control.sleep(1)
        assert await control.is_sleeping() is True
        await control.wake_up()
        assert await control.is_sleeping() is False


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
            await control.wake_up()
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

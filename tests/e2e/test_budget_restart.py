"""A daily cloud budget holds across a restart: `microscheduler serve` (uvicorn) with a key
of `daily_cloud_tokens: 30`, a fake vLLM process as the OpenAI-compatible provider, the
official `openai` SDK as the client. The key is served from the cloud up to its budget,
the gateway is stopped and started again on the same state directory, and the next
request is refused with the budget's reason (before the store, the restart forgot the
spend and served it again). The ledger then answers `GET /usage` (admin and the key)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from tests.fakes.processes import GatewayProcess, fake_vllm_process, free_port, gateway_process

pytestmark = pytest.mark.e2e

AGENTS = "sk-e2e-agents-5120"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
ENV = {"AGENTS_KEY": AGENTS, "E2E_PROVIDER_KEY": "sk-provider"}


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    with ExitStack() as stack:
        cloud = stack.enter_context(fake_vllm_process("cloud-model", "--max-tokens", "12"))
        config = tmp_path / "config"
        config.mkdir()
        # The local entry of the chain answers nothing (a closed port): the cloud serves.
        models = {"backends": {"reasoning": {"url": f"http://127.0.0.1:{free_port()}",
                                             "models": ["reasoning"]}}}  # fmt: skip
        providers = {
            "providers": {
                "cloud": {
                    "kind": "openai",
                    "base_url": cloud + "/v1",
                    "api_key_env": "E2E_PROVIDER_KEY",
                    "model": "cloud-model",
                    "cost_per_mtok": {"input": 1.0, "output": 2.0},
                }
            },
            "chains": {"reasoning": ["reasoning", "cloud"]},
        }
        keys = {"keys": {"agents": {"key_env": "AGENTS_KEY", "daily_cloud_tokens": 30}}}
        (config / "models.yaml").write_text(yaml.safe_dump(models))
        (config / "cloud_providers.yaml").write_text(yaml.safe_dump(providers))
        (config / "keys.yaml").write_text(yaml.safe_dump(keys))
        yield config


def sdk_of(gw: GatewayProcess) -> openai.OpenAI:
    """The agents' client (closed by its `with`, before the gateway stops)."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=AGENTS, max_retries=0, timeout=20)


def test_a_restart_does_not_reset_the_daily_cloud_budget(config: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "var"
    spent = 0
    with (
        gateway_process(config_dir=config, env=ENV, state_dir=state_dir) as gw,
        sdk_of(gw) as sdk,
    ):
        while spent < 30:  # admitted while under the budget: the last one goes over it
            answer = sdk.chat.completions.create(model="reasoning", messages=HI)
            assert answer.usage is not None
            spent += answer.usage.total_tokens
            assert answer.model == "cloud-model"
    assert spent >= 30
    assert (state_dir / "state.db").exists()

    with (
        gateway_process(config_dir=config, env=ENV, state_dir=state_dir) as gw,
        sdk_of(gw) as sdk,
    ):
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model="reasoning", messages=HI)
        assert info.value.status_code == 503
        assert "key_cloud_budget" in info.value.message
        status = httpx.get(gw.url + "/status", timeout=10).json()
        (key,) = status["keys"]
        assert key["cloud_tokens_today"] == spent
        assert key["cloud_budget_unknown"] is False

        # The ledger: the admin (loopback, no admin key) sees every key; the key its own.
        by_route = httpx.get(gw.url + "/usage?group_by=route", timeout=10).json()
        (cloud,) = [row for row in by_route["rows"] if row["route"] == "cloud"]
        assert cloud["cloud"] is True
        assert cloud["cloud_tokens"] == spent
        assert cloud["cost"] is not None
        assert cloud["cost"] > 0
        mine = httpx.get(
            gw.url + "/usage?group_by=key",
            headers={"authorization": f"Bearer {AGENTS}"},
            timeout=10,
        ).json()
        assert [row["key"] for row in mine["rows"]] == ["agents"]
        assert mine["totals"]["cloud_tokens"] == spent

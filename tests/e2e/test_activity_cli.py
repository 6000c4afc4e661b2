"""`microscheduler ps | load | unload | start | stop | activity` against a real gateway process on a
simulated GPU (a pinned and a lazy fake vLLM process), run as a user runs them."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_gaming_cli import backend_state, cli
from tests.fakes.processes import GatewayProcess, free_port, gateway_process, sim_gpu_models

pytestmark = pytest.mark.e2e

CANARY = "walrus-canary-41c9 the prompt nobody may see"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    models = sim_gpu_models(tmp_path_factory.mktemp("activity") / "ledger")
    models["backends"]["lazy"]["idle_ttl_s"] = 600
    with gateway_process(models, wait_ready=True) as gw:
        yield gw


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by their first column (header included), split on 2+ spaces."""
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]
    return {line[0]: line for line in lines}


def test_ps_start_stop_and_activity(gateway: GatewayProcess) -> None:
    ps = cli("ps", url=gateway.url)
    assert ps.returncode == 0, ps.stderr
    print(ps.stdout)
    table = rows(ps.stdout)
    assert table["backend"] == ["backend", "state", "lifecycle", "GPUs", "VRAM MiB",
                                "in flight", "queued", "when idle"]  # fmt: skip
    assert table["pinned"] == ["pinned", "ready", "pinned", "0", "8,000", "0", "0", "-"]
    assert table["lazy"] == ["lazy", "stopped", "lazy", "-", "-", "0", "0", "-"]

    started = cli("start", "lazy", url=gateway.url)
    assert started.returncode == 0, started.stderr
    print(started.stdout)
    assert started.stdout.startswith("lazy: ready (its last start took ")
    table = rows(cli("ps", url=gateway.url).stdout)
    assert table["lazy"][:7] == ["lazy", "ready", "lazy", "0", "6,000", "0", "0"]
    # 600 s counting; a stop (its fake offers no sleep mode), as the page says it.
    assert re.fullmatch(r"stop in (9|10)m \d+s", table["lazy"][7]), table["lazy"]

    body = {"model": "lazy-model", "max_tokens": 5,
            "messages": [{"role": "user", "content": CANARY}]}  # fmt: skip
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    refused = httpx.post(gateway.url + "/v1/chat/completions", json={**body, "model": "nope"})
    assert refused.status_code == 404

    activity = cli("activity", url=gateway.url)
    assert activity.returncode == 0, activity.stderr
    print(activity.stdout)
    assert CANARY not in activity.stdout
    lines = activity.stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == ["time", "key", "model", "route", "api", "status", "tokens in/out",
                      "tok/s", "wait", "fallbacks", "duration"]  # fmt: skip
    newest, served = (re.split(r"\s{2,}", line) for line in lines[1:3])
    assert newest[1:6] == ["anonymous", "-", "-", "chat_completions", "404"]
    assert served[1:7] == ["anonymous", "lazy-model", "lazy", "chat_completions", "200",
                           f"{usage['prompt_tokens']}/{usage['completion_tokens']}"]  # fmt: skip
    assert served[8:10] == ["-", "0"]  # no wait (started already), no fallback

    only = cli("activity", "--model", "lazy-model", "--limit", "1", url=gateway.url)
    assert only.returncode == 0, only.stderr
    assert len(only.stdout.splitlines()) == 2
    assert "lazy-model" in only.stdout.splitlines()[1]
    nobody = cli("activity", "--key", "someone-else", url=gateway.url)
    assert (nobody.returncode, nobody.stdout.strip()) == (0, "no requests yet")

    stopped = cli("stop", "lazy", url=gateway.url)
    assert stopped.returncode == 0, stopped.stderr
    print(stopped.stdout)
    assert stopped.stdout.strip() == "lazy: stopped"
    assert backend_state(gateway, "lazy") == "stopped"


def test_a_wake_wait_shows_in_activity(gateway: GatewayProcess) -> None:
    assert backend_state(gateway, "lazy") in ("stopped", "ready")
    cli("stop", "lazy", url=gateway.url)
    body = {"model": "lazy-model", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}
    answer = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200
    assert answer.headers["x-microscheduler-wait"].endswith("; reason=wake")
    activity = cli("activity", "--limit", "1", url=gateway.url)
    print(activity.stdout)
    row = re.split(r"\s{2,}", activity.stdout.splitlines()[1])
    assert re.fullmatch(r"\d+\.\d{2,3}s wake", row[8]), row


def test_load_and_unload_a_model_by_its_name(gateway: GatewayProcess) -> None:
    cli("stop", "lazy", url=gateway.url)
    loaded = cli("load", "lazy-model", url=gateway.url)
    assert loaded.returncode == 0, loaded.stderr
    print(loaded.stdout)
    assert loaded.stdout.strip() == "lazy-model: loaded"
    assert backend_state(gateway, "lazy") == "ready"
    unloaded = cli("unload", "lazy-model", url=gateway.url)
    assert unloaded.returncode == 0, unloaded.stderr
    print(unloaded.stdout)
    # Its fake offers no sleep mode: its idle method (auto) stops it.
    assert re.fullmatch(r"lazy-model: unloaded \(.*unload.*\)", unloaded.stdout.strip())
    assert backend_state(gateway, "lazy") == "stopped"
    unknown = cli("load", "nope", url=gateway.url)
    assert unknown.returncode == 1
    assert "error: load: " in unknown.stderr
    assert "(HTTP 404)" in unknown.stderr


def test_unknown_backends_and_an_unreachable_gateway(gateway: GatewayProcess) -> None:
    unknown = cli("start", "nope", url=gateway.url)
    assert unknown.returncode == 1
    assert "error: start: no backend named 'nope'" in unknown.stderr
    assert "(HTTP 404)" in unknown.stderr
    down = f"http://127.0.0.1:{free_port()}"
    for command in (["ps"], ["stop", "lazy"], ["activity"]):
        done = cli(*command, url=down)
        assert done.returncode == 3, done
        assert f"cannot reach the gateway at {down}" in done.stderr

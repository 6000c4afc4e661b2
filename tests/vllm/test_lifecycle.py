"""The lifecycle against a real vLLM: a gateway killed with SIGKILL finds the server it
started and adopts it (vLLM runs as a console script, which /proc shows behind its
interpreter); a yield stops it (no sleep mode here) and a restore lets the next request
start it again; without requests it is stopped after `idle_ttl_s`."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.processes import GatewayProcess, free_port, gateway_process
from tests.fakes.waits import until_sync
from tests.vllm.real import ADMIN, KEY_ENV, START_TIMEOUT_S, RealVllm, chat_body, status_of

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

IDLE_TTL_S = 30


def pid_of(gw: GatewayProcess) -> int | None:
    detail = status_of(gw.url, "tiny")["runtime_detail"] or ""
    return int(detail.split()[1]) if detail.startswith("pid ") else None


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def chat(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions", json=chat_body(max_tokens=3), timeout=START_TIMEOUT_S
    )


@contextlib.contextmanager
def killed_afterwards(pids: list[int]) -> Iterator[None]:
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_a_crash_adoption_a_yield_a_restore_and_an_idle_stop(
    real_vllm: RealVllm, tmp_path: Path
) -> None:
    config = {"backends": {"tiny": real_vllm.backend(free_port(), idle_ttl_s=IDLE_TTL_S)}}
    state_dir = tmp_path / "var"
    pids: list[int] = []
    with killed_afterwards(pids):
        with gateway_process(config, env=KEY_ENV, state_dir=state_dir) as first:
            assert chat(first).status_code == 200
            pid = until_sync(lambda: pid_of(first))
            pids.append(pid)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
        assert alive(pid)  # the server outlived the gateway

        with gateway_process(config, env=KEY_ENV, state_dir=state_dir) as second:
            # Adopted, not dropped as "gone" (its /proc cmdline starts with python3.11,
            # not with the configured bin/vllm) and not started a second time.
            until_sync(lambda: status_of(second.url, "tiny")["state"] == "ready", timeout_s=30)
            assert pid_of(second) == pid
            assert "(adopted)" in status_of(second.url, "tiny")["runtime_detail"]
            assert chat(second).status_code == 200
            log = second.log()
            assert "adopting process backend=tiny" in log
            assert "process started" not in log

            yielded = httpx.post(
                second.url + "/vram/yield", json={"reason": "game"}, headers=ADMIN, timeout=120
            ).json()
            # No sleep mode on this server (no VLLM_SERVER_DEV_MODE): stopped instead.
            assert yielded["stopped"] == ["tiny"], yielded
            until_sync(lambda: not alive(pid), what="the adopted server gone")
            refused = chat(second)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "backend_yielded"

            restored = httpx.post(second.url + "/vram/restore", headers=ADMIN, timeout=30)
            assert restored.json()["on_demand"] == ["tiny"], restored.text
            assert chat(second).status_code == 200  # started again by the request
            new_pid = until_sync(lambda: pid_of(second))
            pids.append(new_pid)
            assert new_pid != pid

            until_sync(
                lambda: status_of(second.url, "tiny")["state"] == "stopped",
                timeout_s=IDLE_TTL_S + 60,
                what="the idle stop",
            )
            assert not alive(new_pid)
            assert "to=stopped reason=stopped by the gateway (idle)" in second.log()

"""Two lazy equals that do not fit on the GPU together, asked for at once and in turn: each
request is served (the second start waits for the first, then takes its turn), never
refused for memory; while it waits, /status says what for."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import free_port, gateway_process
from tests.vllm.real import KEY_ENV, START_TIMEOUT_S, RealVllm, chat_body, status_of

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_two_equals_asked_at_once_take_turns(real_vllm: RealVllm, tmp_path: Path) -> None:
    # 20 GiB each on a simulated 32 GiB GPU: one at a time. Same priority: equals.
    def equal(name: str) -> dict[str, Any]:
        backend = real_vllm.backend(free_port(), vram_mib=20000, max_hold_s=0)
        backend["models"] = [name]
        backend["runtime"]["command"][backend["runtime"]["command"].index("tiny")] = name
        return backend

    config = {
        "gpu": {"probe": "sim", "sim": {"total_mib": 32768, "ledger_dir": str(tmp_path / "gpu")}},
        "backends": {"turn-a": equal("turn-a"), "turn-b": equal("turn-b")},
    }
    answers: dict[str, httpx.Response] = {}

    def ask(label: str, model: str) -> None:
        body = {**chat_body(max_tokens=3), "model": model}
        answers[label] = httpx.post(
            gw.url + "/v1/chat/completions", json=body, timeout=2 * START_TIMEOUT_S
        )

    with gateway_process(config, env=KEY_ENV) as gw:
        asks = [
            threading.Thread(target=ask, args=(label, model))
            for label, model in (("a1", "turn-a"), ("b1", "turn-b"), ("a2", "turn-a"))
        ]
        for thread in asks:
            thread.start()
            time.sleep(0.3)  # interleaved, in this order
        waiting_said: set[str] = set()
        while any(thread.is_alive() for thread in asks):
            for name in ("turn-a", "turn-b"):
                said = status_of(gw.url, name)["starting"]
                if said and "waiting for" in said:
                    waiting_said.add(said)
            time.sleep(0.2)
        refused = {k: r.text for k, r in answers.items() if r.status_code != 200}
        assert not refused
        assert len(answers) == 3
        # Whichever started first, the other said it waited for that start.
        assert any(
            "waiting for turn-a's start on GPU 0" in said
            or "waiting for turn-b's start on GPU 0" in said
            for said in waiting_said
        ), waiting_said

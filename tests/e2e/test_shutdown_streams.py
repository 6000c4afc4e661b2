"""SIGTERM with streams that outlive the grace: a real gateway process before a paced fake
vLLM. Each stream still open shortly before the grace is over ends with the in-band error
(`gateway_stopping`): `data: {"error": ...}` then `data: [DONE]` for chat, `event: error` for
the Messages API; none is cut with no end, and the gateway's log has no traceback. (Before,
every one was cut when uvicorn cancelled its task, with "Exception in ASGI application".)"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.processes import GatewayProcess, fake_vllm_process, gateway_process

pytestmark = pytest.mark.e2e

TOKENS_PER_S = 20  # a stream of 400 tokens takes 20 s: it outlives any grace below
GRACE_S = 2.0
CHATS = 12
MESSAGES = 8


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    with fake_vllm_process("paced", "--tokens-per-second", str(TOKENS_PER_S)) as url:
        yield url


class Stream:
    """One streaming request read on a thread until the server ends it."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        self.begun = threading.Event()
        self.text = ""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(url + path, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url, json=body, timeout=30) as response:
                for text in response.iter_text():
                    self.text += text
                    self.begun.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.begun.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream neither finished nor failed"

    def events(self) -> list[tuple[str | None, str]]:
        """(event name, data) of each event."""
        out = []
        for block in self.text.split("\n\n"):
            lines = block.splitlines()
            name = next((ln[7:] for ln in lines if ln.startswith("event: ")), None)
            data = next((ln[6:] for ln in lines if ln.startswith("data: ")), None)
            if data is not None:
                out.append((name, data))
        return out


def test_sigterm_ends_every_open_stream_in_band_before_the_grace_runs_out(paced: str) -> None:
    config = {"backends": {"b": {"url": paced, "models": ["paced"]}}}
    env = {"MICROSCHEDULER_SHUTDOWN_GRACE_S": str(GRACE_S)}
    with gateway_process(config, env=env) as gw:
        prompt = [{"role": "user", "content": "hi"}]
        chats = [
            Stream(gw.url, "/v1/chat/completions",
                   {"model": "paced", "messages": prompt, "stream": True, "max_tokens": 400})
            for _ in range(CHATS)
        ]  # fmt: skip
        messages = [
            Stream(gw.url, "/v1/messages",
                   {"model": "paced", "messages": prompt, "stream": True, "max_tokens": 400})
            for _ in range(MESSAGES)
        ]  # fmt: skip
        for stream in chats + messages:
            assert stream.begun.wait(15), "a stream did not begin"
        gw.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        for stream in chats + messages:
            stream.join(GRACE_S + 10)
        ended = time.monotonic() - sent
        took = exited_after(gw, sent, GRACE_S + 10)
        print(f"{CHATS + MESSAGES} streams ended {ended:.2f}s after SIGTERM; the gateway "
              f"exited after {took:.2f}s (grace {GRACE_S}s)")  # fmt: skip
        log = gw.log()
        for stream in chats:
            assert stream.error is None, (stream.error, stream.text[-300:])
            events = stream.events()
            assert events[-1] == (None, "[DONE]"), stream.text[-300:]
            error = json.loads(events[-2][1])["error"]
            assert error["code"] == "gateway_stopping"
            assert error["type"] == "server_error"
        for stream in messages:
            assert stream.error is None, (stream.error, stream.text[-300:])
            name, data = stream.events()[-1]
            assert name == "error", stream.text[-300:]
            event = json.loads(data)
            assert event["type"] == "error"
            assert "shutting down" in event["error"]["message"]
        assert ended < GRACE_S + 1
        assert "Traceback" not in log, log
        assert "Exception in ASGI application" not in log, log
        assert f"{CHATS + MESSAGES} open responses ended in-band" in log


def exited_after(gw: GatewayProcess, sent: float, timeout_s: float) -> float:
    gw.proc.wait(timeout_s)
    return time.monotonic() - sent

"""The start failures a new user meets first, against the real server: each request is
answered 503 with vLLM's own decisive line quoted, a hint, and where to read the rest
(`microscheduler logs NAME`); a port something else already answers on is refused before
anything is launched."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.processes import GatewayProcess, free_port, gateway_process
from tests.vllm.real import KEY_ENV, MODEL_ID, RealVllm, chat_body, status_of

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

# name -> (how its command goes wrong, what vLLM's quoted line says, what the hint names)
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "unknown-flag": (
        {"extra": ("--no-such-flag",)},
        "unrecognized arguments: --no-such-flag",
        "vllm serve --help",
    ),
    "missing-folder": (
        {"model": "/nonexistent/models/tiny-llama"},
        "Repo id must be in the form",
        "--model",
    ),
    "not-cached": (
        {"model": "microscheduler-tests/no-such-model"},
        "Cannot find an appropriate cached snapshot folder",
        "HF_HUB_OFFLINE",
    ),
    "context-too-long": (
        {"extra": ("--max-model-len", "65536")},
        "User-specified max_model_len (65536) is greater than the derived max_model_len",
        "--max-model-len",
    ),
    "sleep-mode": (
        {"extra": ("--enable-sleep-mode",)},
        "sleep mode",
        "--enable-sleep-mode",
    ),
}


def backend_for(real_vllm: RealVllm, name: str) -> dict[str, Any]:
    how = CASES[name][0]
    backend = real_vllm.backend(free_port(), *how.get("extra", ()), model=how.get("model"))
    backend["models"] = [name]
    command = backend["runtime"]["command"]
    command[command.index(MODEL_ID)] = name
    if name == "context-too-long":  # the later flag wins in argparse; drop the default one
        at = command.index("--max-model-len")
        del command[at : at + 2]
    return backend


class Squatter(http.server.BaseHTTPRequestHandler):
    """Another server on the backend's port: answers everything 200 (its own /health)."""

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "someone-elses-model"}]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def squatted_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(real_vllm: RealVllm, squatted_port: int) -> Iterator[GatewayProcess]:
    backends = {name: backend_for(real_vllm, name) for name in CASES}
    squatted = real_vllm.backend(squatted_port)
    squatted["models"] = ["squatted"]
    backends["squatted"] = squatted
    with gateway_process({"backends": backends}, env=KEY_ENV) as gw:
        yield gw


@pytest.mark.parametrize("name", list(CASES))
def test_a_failed_start_quotes_vllm_with_a_hint(gateway: GatewayProcess, name: str) -> None:
    _, quoted, hint = CASES[name]
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json={**chat_body(), "model": name}, timeout=300
    )
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    reason = status_of(gateway.url, name)["reason"]
    for text in (message, reason):
        assert quoted in text, text
        assert hint in text, text
        assert f"microscheduler logs {name}" in text, text
        assert "Traceback" not in text


def test_a_port_another_server_answers_on_is_refused(gateway: GatewayProcess) -> None:
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json={**chat_body(), "model": "squatted"}, timeout=60
    )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_port_in_use", error
    assert "already answers" in error["message"], error
    status = status_of(gateway.url, "squatted")
    assert status["state"] != "ready"
    assert "process started backend=squatted" not in gateway.log()  # nothing launched

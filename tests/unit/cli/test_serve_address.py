"""What `serve` says about its address (`app.cli.serve_address`): `--banner`'s lines with
the address bound, the error for a taken port (the ways out, and what answers there), and
`make run`, which passes --host/--port only when HOST/PORT are given, so the gateway's
own setting (MICROSCHEDULER_PORT, `port:` of models.yaml) decides otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from app.cli.serve_address import banner, base_url, holder_of, in_use_message, url_host
from app.settings import load_settings
from tests.fakes.processes import ROOT, free_port

MODELS = {
    "backends": {
        "always": {"url": "http://127.0.0.1:9", "models": ["big-model"],
                   "runtime": {"kind": "external"}},
    },
}  # fmt: skip


def test_a_url_host_is_one_a_local_client_can_open() -> None:
    assert [url_host(h) for h in ("127.0.0.1", "0.0.0.0", "", "::", "::1", "gw.lan")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.1", "[::1]", "[::1]", "gw.lan",
    ]  # fmt: skip
    assert base_url("0.0.0.0", 8081) == "http://127.0.0.1:8081"


def test_the_banner_shows_the_port_bound_and_a_request_to_try(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(MODELS))
    settings = load_settings(tmp_path)
    text = banner(settings, Path("config/x"), "127.0.0.1", 8123)
    lines = text.splitlines()
    assert lines[0] == (
        "microscheduler: serving config/x on http://127.0.0.1:8123 "
        "(Ctrl-C stops it and its backends)."
    )
    assert "Open http://127.0.0.1:8123/ for the control page." in lines
    curl = lines[-1].strip()
    assert curl.startswith("curl -sN http://127.0.0.1:8123/v1/chat/completions ")
    body = json.loads(curl.split(" -d ", 1)[1].strip("'"))
    assert body["model"] == "big-model"


def test_the_demo_banner_tries_its_lazy_model() -> None:
    settings = load_settings(ROOT / "config" / "demo")
    assert '"model": "reasoning"' in banner(settings, None, "127.0.0.1", 8080)


def test_a_taken_port_names_the_ways_out() -> None:
    message = in_use_message("127.0.0.1", 8080, "Address already in use", None)
    assert message == (
        "cannot listen on 127.0.0.1:8080: Address already in use; stop what holds port 8080, "
        "or choose another port: --port N, MICROSCHEDULER_PORT=N, `port: N` in models.yaml, "
        "or make run PORT=N"
    )
    held = in_use_message("127.0.0.1", 8080, "Address already in use", "another microscheduler")
    assert "Address already in use; it is held by another microscheduler; stop" in held


class _Health(BaseHTTPRequestHandler):
    status = 200
    body: ClassVar[dict[str, Any]] = {"status": "ok"}

    def do_GET(self) -> None:
        data = json.dumps(self.body if self.path == "/health" else {}).encode()
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _NotOurs(_Health):
    status = 404
    body: ClassVar[dict[str, Any]] = {"detail": "Not Found"}


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="health-stand-in", daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def microscheduler_port() -> Iterator[int]:
    yield from _serve(_Health)


@pytest.fixture
def other_server_port() -> Iterator[int]:
    yield from _serve(_NotOurs)


def test_what_holds_the_port_is_told_by_its_answer_to_health(
    microscheduler_port: int, other_server_port: int
) -> None:
    assert holder_of("127.0.0.1", microscheduler_port) == (
        "another microscheduler, by its answer to GET /health"
    )
    assert holder_of("0.0.0.0", microscheduler_port) is not None  # asked on loopback
    assert holder_of("127.0.0.1", other_server_port) == (
        "an HTTP server, by its answer to GET /health (HTTP 404)"
    )
    assert holder_of("127.0.0.1", free_port()) is None  # nothing answers


def _make_run(*assignments: str) -> str:
    make = shutil.which("make")
    assert make is not None, "make is needed (the README's `make run`)"
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT")}
    env["MICROSCHEDULER_PORT"] = "8765"
    done = subprocess.run(
        [make, "-n", "run", *assignments], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    serve = [line for line in done.stdout.splitlines() if " serve " in line]
    assert len(serve) == 1, done.stdout
    return serve[0]


def test_make_run_leaves_the_port_to_the_gateway_unless_port_is_given() -> None:
    """Before, it passed --port 8080 (and --host 127.0.0.1), which beat MICROSCHEDULER_PORT."""
    line = _make_run()
    assert "--port" not in line, line
    assert "--host" not in line, line
    assert line.split()[-1] == "--banner"
    given = _make_run("PORT=8081", "HOST=0.0.0.0").split()
    assert given[given.index("--port") + 1] == "8081"
    assert given[given.index("--host") + 1] == "0.0.0.0"

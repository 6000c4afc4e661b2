"""`microscheduler status | head -1`: the reader leaves after the first line and the CLI ends
quietly, exit 141 (128 + SIGPIPE, as a shell reports any command SIGPIPE ended), instead of a
BrokenPipeError traceback. A real pipe between two processes, `head` the reader; the
gateway is a stand-in answering `GET /status` with a table far larger than a pipe holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.processes import ROOT

pytestmark = pytest.mark.e2e

# About 1.5 MB of table: more than any pipe buffer (64 KiB by default on Linux), so the
# CLI is still writing when `head` has left.
STATUS: dict[str, Any] = {
    "gpu": {"gpus": []},
    "backends": [
        {
            "name": f"backend-{i:05d}",
            "state": "stopped",
            "lifecycle": "lazy",
            "in_flight": 0,
            "waiting": 0,
            "vram": {"admission_mib": 1000},
            "reason": "x" * 60,
        }
        for i in range(20_000)
    ],
}


# A backend's output, as large: `microscheduler logs` is still writing when `head` leaves.
LOGS = b"".join(b"INFO line %06d of the backend's output\n" % i for i in range(40_000))


class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        is_logs = self.path.startswith("/backends/m/logs")
        body = LOGS if is_logs else json.dumps(STATUS).encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain" if is_logs else "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def gateway_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, name="status-stand-in", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_status_piped_into_head_ends_quietly_with_141(
    gateway_url: str, flags: list[str], tmp_path: Path
) -> None:
    head_path = shutil.which("head")
    assert head_path is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("wb") as stderr:
        cli = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "status", "--url", gateway_url, *flags],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        assert cli.stdout is not None
        with cli.stdout:
            head = subprocess.run(
                [head_path, "-c" if flags else "-1", *(["100"] if flags else [])],
                stdin=cli.stdout, capture_output=True, timeout=60, check=True,
            )  # fmt: skip
        code = cli.wait(timeout=60)
    err = stderr_path.read_text()
    if flags:
        assert head.stdout.startswith(b'{"gpu": {"gpus": []}, "backends": [')
    else:
        assert head.stdout == f"gateway {gateway_url}\n".encode()
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert err == ""
    assert code == 141


def test_logs_piped_into_head_ends_quietly_with_141(gateway_url: str, tmp_path: Path) -> None:
    """`microscheduler logs m | head -1`: main's broken-pipe handler, as for every command
    (the command swallowed it and said 0)."""
    head_path = shutil.which("head")
    assert head_path is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("wb") as stderr:
        cli = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "logs", "m", "--url", gateway_url],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
        assert cli.stdout is not None
        with cli.stdout:
            head = subprocess.run([head_path, "-1"], stdin=cli.stdout, capture_output=True,
                                  timeout=60, check=True)  # fmt: skip
        code = cli.wait(timeout=60)
    assert head.stdout == b"INFO line 000000 of the backend's output\n"
    assert stderr_path.read_text() == ""
    assert code == 141

"""`microscheduler yield -- CMD`: the command (a Steam game) always runs. When the yield
cannot be had (the gateway down, no admin key or a refused one, a key file that cannot be
read, too little freed), a warning says why, the command runs anyway, its exit code is
the CLI's and nothing is restored; when it was had, it is restored after the command.

The gateway is a stand-in (a thread of `http.server`) that wants the admin key
`sk-admin-test`, as a gateway with `MICROSCHEDULER_ADMIN_KEY` set does, and records what it
was asked. The CLI runs in this process (`app.cli.build_parser`), the command as a real
child process."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.cli import build_parser

KEY = "sk-admin-test"
GAME = ["sh", "-c", "echo game ran; exit 7"]

YIELDED = {
    "state": "yielded", "reason": "gaming", "gpu": 0, "freed_mib": 8000, "free_mib": 24576,
    "stopped": ["pinned"], "slept": [], "met": None,
}  # fmt: skip
RESTORED = {"restored": True, "back": ["pinned"], "starting": [], "on_demand": []}


@dataclass
class StandIn:
    """What the stand-in gateway answers and what it was asked."""

    url: str = ""
    yield_answer: dict[str, Any] = field(default_factory=lambda: dict(YIELDED))
    yield_status: int = 200
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, auth
    bodies: list[tuple[str, Any]] = field(default_factory=list)  # path, JSON body (None: none)


def _handler(state: StandIn) -> type[BaseHTTPRequestHandler]:
    class Admin(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            state.bodies.append((self.path, json.loads(raw) if raw else None))
            auth = self.headers.get("authorization")
            state.calls.append(("POST", self.path, auth))
            if auth != f"Bearer {KEY}":
                message = "This endpoint needs the admin key as a Bearer token."
                self._answer(401, {"error": {"message": message, "code": "unauthorized"}})
            elif self.path == "/vram/yield":
                self._answer(state.yield_status, state.yield_answer)
            elif self.path == "/vram/restore":
                self._answer(200, RESTORED)
            else:
                self._answer(404, {"error": {"message": "not found"}})

        def do_GET(self) -> None:
            state.calls.append(("GET", self.path, self.headers.get("authorization")))
            self._answer(200, {"gpu": {"gpus": []}, "backends": []})

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Admin


@pytest.fixture
def gateway() -> Iterator[StandIn]:
    state = StandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, name="admin-stand-in", daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(autouse=True)
def no_key_around(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No key from the developer's environment or their ~/.config."""
    for name in (
        "MICROSCHEDULER_ADMIN_KEY", "MICROSCHEDULER_ADMIN_KEY_FILE", "MICROSCHEDULER_URL",
        "MICROSCHEDULER_PORT",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    code: int = args.func(args)
    return code


def closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now


def test_a_gateway_that_is_down_still_starts_the_game_with_its_exit_code(
    capfd: pytest.CaptureFixture[str],
) -> None:
    url = closed_url()
    assert run("yield", "--url", url, "--", *GAME) == 7
    out, err = capfd.readouterr()
    assert "game ran" in out
    assert f"warning: yield: the GPU was not freed (cannot reach the gateway at {url}: " in err, err
    assert "starting the command anyway" in err


def test_without_a_command_a_gateway_that_is_down_is_still_exit_3(
    capfd: pytest.CaptureFixture[str],
) -> None:
    url = closed_url()
    assert run("yield", "--url", url) == 3
    assert f"error: yield: cannot reach the gateway at {url}" in capfd.readouterr().err


def test_no_admin_key_still_starts_the_game_and_says_where_a_key_comes_from(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert run("yield", "--url", gateway.url, "--", *GAME) == 7
    out, err = capfd.readouterr()
    assert "game ran" in out
    assert "warning: yield: the GPU was not freed (the gateway refused it: " in err
    assert "(HTTP 401)" in err
    assert "no admin key was sent: set MICROSCHEDULER_ADMIN_KEY, write the key to " in err
    assert str(tmp_path / "xdg" / "microscheduler" / "admin.key") in err
    assert "--admin-key-file" in err
    assert [path for _, path, _ in gateway.calls] == ["/vram/yield"]  # nothing to restore


def test_a_refused_key_still_starts_the_game_and_never_prints_the_key(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", "sk-wrong-secret")
    assert run("yield", "--url", gateway.url, "--", *GAME) == 7
    out, err = capfd.readouterr()
    assert "the admin key sent, from MICROSCHEDULER_ADMIN_KEY, was refused" in err
    assert "sk-wrong-secret" not in out + err


def test_an_unreadable_key_file_still_starts_the_game(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such.key"
    assert run("yield", "--url", gateway.url, "--admin-key-file", str(missing), "--", *GAME) == 7
    err = capfd.readouterr().err
    assert f"the GPU was not freed (cannot read the admin key file {missing}" in err
    assert gateway.calls == []  # no call without the key that was asked for


def test_the_key_from_admin_key_file_yields_and_restores_after_the_game(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key_file = tmp_path / "admin.key"
    key_file.write_text(KEY + "\n")
    assert run("yield", "--url", gateway.url, "--admin-key-file", str(key_file), "--", *GAME) == 7
    out, err = capfd.readouterr()
    assert "yielded for 'gaming' on GPU 0: freed 8,000 MiB" in out
    assert "restored: back pinned" in out
    assert "warning" not in err
    assert gateway.calls == [
        ("POST", "/vram/yield", f"Bearer {KEY}"),
        ("POST", "/vram/restore", f"Bearer {KEY}"),
    ]
    assert KEY not in out + err


def last_body(gateway: StandIn) -> tuple[str, Any]:
    return gateway.bodies[-1]


def test_after_the_game_it_lets_go_of_its_own_hold_only(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: the restore after the game names its reason, so a yield held by someone
    else too (a schedule's window) holds on; `restore` by hand ends every hold."""
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", KEY)
    assert run("yield", "--url", gateway.url, "--reason", "elden ring", "--", *GAME) == 7
    assert gateway.bodies[-1] == ("/vram/restore", {"reason": "elden ring"})
    assert run("restore", "--url", gateway.url) == 0
    assert last_body(gateway) == ("/vram/restore", None)
    assert run("restore", "--url", gateway.url, "--reason", "game", "--host", "node-c") == 0
    assert last_body(gateway) == ("/vram/restore", {"host": "node-c", "reason": "game"})
    assert "warning" not in capfd.readouterr().err


def test_a_hold_added_to_a_yield_held_says_how_to_let_go_of_it(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", KEY)
    gateway.yield_answer = {**YIELDED, "already": True, "holders": ["schedule evening", "game"]}
    assert run("yield", "--url", gateway.url, "--reason", "game") == 0
    out = capfd.readouterr().out
    assert (
        "let go of this hold with: microscheduler restore --reason game; "
        "end every hold: microscheduler restore"
    ) in out


def test_the_key_file_of_the_user_config_directory_is_read(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What Steam's launch option gets, without the user's shell variables."""
    default = tmp_path / "xdg" / "microscheduler" / "admin.key"
    default.parent.mkdir(parents=True)
    default.write_text(KEY)
    assert run("yield", "--url", gateway.url, "--", *GAME) == 7
    assert [auth for _, _, auth in gateway.calls] == [f"Bearer {KEY}"] * 2
    assert "warning" not in capfd.readouterr().err


NOT_MET = {
    "error": {
        "message": "only 16,576 MiB free on GPU 0 after the yield, not the 20,000 MiB asked "
        "for (min_free_mib): the yield is undone and the models may use the GPU again. It "
        "took nothing; still holding memory: pinned (pinned; include_pinned is false)",
        "type": "invalid_request_error", "param": None, "code": "yield_not_met",
    }
}  # fmt: skip


def test_too_little_freed_is_the_gateways_verdict_and_the_game_still_starts(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway undid the yield and refused it (409): the CLI says so, restores
    nothing (there is nothing to restore) and starts the game."""
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", KEY)
    gateway.yield_status, gateway.yield_answer = 409, NOT_MET
    argv = ("yield", "--url", gateway.url, "--min-free-mib", "20000", "--", *GAME)
    assert run(*argv) == 7
    out, err = capfd.readouterr()
    assert "warning: yield: the GPU was not freed (the gateway refused it: only 16,576 MiB " in err
    assert "still holding memory: pinned" in err
    assert "game ran" in out
    assert [p for m, p, _ in gateway.calls if m == "POST"] == ["/vram/yield"]


def test_too_little_freed_without_a_command_fails_with_the_gateways_words(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", KEY)
    gateway.yield_status, gateway.yield_answer = 409, NOT_MET
    assert run("yield", "--url", gateway.url, "--min-free-mib", "20000") == 1
    err = capfd.readouterr().err
    assert "only 16,576 MiB free on GPU 0 after the yield, not the 20,000 MiB" in err
    assert "(HTTP 409)" in err
    assert [p for m, p, _ in gateway.calls if m == "POST"] == ["/vram/yield"]


def test_the_help_shows_the_steam_launch_option_as_steam_wants_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["yield", "--help"])
    help_text = capsys.readouterr().out
    assert "/home/you/microscheduler/.venv/bin/microscheduler yield -- %command%" in help_text
    assert "%%" not in help_text
    assert "--admin-key-file" in help_text


def test_without_url_the_gateway_is_found_on_microscheduler_port(
    gateway: StandIn, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port the gateway was told (`MICROSCHEDULER_PORT=8081 make run`) is where the
    CLI of the same environment looks for it (before: always 8080)."""
    monkeypatch.setenv("MICROSCHEDULER_ADMIN_KEY", KEY)
    monkeypatch.setenv("MICROSCHEDULER_PORT", gateway.url.rsplit(":", 1)[1])
    assert run("yield", "--", *GAME) == 7
    assert [path for _, path, _ in gateway.calls] == ["/vram/yield", "/vram/restore"]
    assert "warning" not in capfd.readouterr().err

"""A gateway killed with SIGKILL (an OOM kill, a crash) leaves its process backends running:
the next gateway on the same state directory adopts them (same pids, ready at once, their
memory counted as theirs) and stops those the configuration no longer wants."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    gateway_process,
    port_is_open,
    sim_gpu_models,
    stop,
)
from tests.fakes.state import saved_sections
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

# The orphans hold 22000 of the simulated 24576 MiB: a pinned backend started anew instead
# of adopted finds no room (the finding: 503 backend_no_vram).
MIB = {"pinned_mib": 14000, "lazy_mib": 8000}


def backends(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    listed = httpx.get(gw.url + "/backends", timeout=5).json()["backends"]
    return {b["name"]: b for b in listed}


def pid_of(gw: GatewayProcess, name: str) -> int | None:
    detail = backends(gw)[name]["runtime_detail"] or ""
    return int(detail.split()[1]) if detail.startswith("pid ") else None


def chat(gw: GatewayProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def relays_of(output: Path) -> list[int]:
    """The pids of the output relays writing `output`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            words = cmdline.read_bytes().split(b"\0")
            if b"app.runtimes.output_relay" in words and str(output).encode() in words:
                found.append(int(cmdline.parent.name))
    return found


@contextlib.contextmanager
def killed_afterwards(pids: dict[str, int]) -> Iterator[None]:
    """Whatever happens in the test, no fake server outlives it (`pids`: filled in)."""
    try:
        yield
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def crash_with_both_running(models: dict[str, Any], state_dir: Path, pids: dict[str, int]) -> None:
    """A gateway that started the pinned backend and woke the lazy one, then SIGKILLed;
    `pids` gets the pids of both servers, still running."""
    with gateway_process(models, state_dir=state_dir, wait_ready=True) as gw:
        pids["pinned"] = until_sync(lambda: pid_of(gw, "pinned"))
        assert chat(gw, "lazy-model").status_code == 200
        pids["lazy"] = until_sync(lambda: pid_of(gw, "lazy"))
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(10)
    assert all(alive(pid) for pid in pids.values())


def test_a_restarted_gateway_adopts_the_servers_a_crash_left_running(tmp_path: Path) -> None:
    models = sim_gpu_models(tmp_path / "sim-gpu", **MIB)
    state_dir = tmp_path / "var"
    pids: dict[str, int] = {}
    with killed_afterwards(pids):
        crash_with_both_running(models, state_dir, pids)
        with gateway_process(models, state_dir=state_dir, wait_ready=True) as gw:
            states = backends(gw)
            assert {n: states[n]["state"] for n in pids} == {"pinned": "ready", "lazy": "ready"}
            assert {n: pid_of(gw, n) for n in pids} == pids
            assert "(adopted)" in states["lazy"]["runtime_detail"]
            assert states["pinned"]["holds_vram"]
            assert states["lazy"]["holds_vram"]
            for model in ("pinned-model", "lazy-model"):
                response = chat(gw, model)
                assert response.status_code == 200, response.text
            stop(gw.proc)
            log = gw.log()
        assert "process started" not in log  # nothing started anew
        assert "adopting process backend=pinned" in log
        assert "adopting process backend=lazy" in log
        # Stopped with the gateway like servers it started (no waitpid: polled).
        until_sync(lambda: not any(alive(pid) for pid in pids.values()), what="both gone")
        assert "process stopped backend=lazy pid=" in log
        # Its output relay outlived the crash: the server's last words, written after the
        # second gateway stopped it, are in its file; then the relay ended with it.
        output = state_dir / "logs" / "lazy.log"
        until_sync(lambda: not relays_of(output), what="the relay gone")
        assert output.read_text().count("] listening on ") == 1  # one run, never restarted
        assert output.read_text().rstrip().endswith("shutting down")


def test_the_orphan_of_a_backend_no_longer_configured_is_stopped(tmp_path: Path) -> None:
    models = sim_gpu_models(tmp_path / "sim-gpu", **MIB)
    state_dir = tmp_path / "var"
    pids: dict[str, int] = {}
    with killed_afterwards(pids):
        crash_with_both_running(models, state_dir, pids)
        lazy_port = int(models["backends"]["lazy"]["url"].rsplit(":", 1)[1])
        del models["backends"]["lazy"]
        with gateway_process(models, state_dir=state_dir, wait_ready=True) as gw:
            until_sync(lambda: not alive(pids["lazy"]), what="the removed backend's orphan gone")
            assert not port_is_open(lazy_port)
            assert pid_of(gw, "pinned") == pids["pinned"]  # still adopted
            assert chat(gw, "pinned-model").status_code == 200
            stop(gw.proc)
            log = gw.log()
        assert "stopping process left by an earlier gateway backend=lazy" in log
        assert "why=backend removed" in log
        records = saved_sections(state_dir)["processes"]
        assert "lazy" not in records


def settled(backend: dict[str, Any]) -> dict[str, Any] | None:
    """`backend` once it is no longer on its way to ready (ready, failed, refused)."""
    waiting = backend["state"] == "starting" or (
        backend["state"] == "stopped" and backend["reason"] is None
    )
    return None if waiting else backend


def console_script(path: Path) -> Path:
    """An executable like the `vllm` a pip install writes: a `#!` line naming the
    interpreter, so /proc shows `[python, path, serve, ...]` for the argv `[path, serve, ...]`;
    `serve` dropped, it runs the fake vLLM."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "if sys.argv[1:2] == ['serve']:\n"
        "    del sys.argv[1]\n"
        "runpy.run_module('app.sim.vllm', run_name='__main__', alter_sys=True)\n"
    )
    path.chmod(0o755)
    return path


def test_a_console_script_server_is_adopted_after_a_crash(tmp_path: Path) -> None:
    """Issue 31: the record holds the argv as configured, /proc the interpreter first; the
    process is found by its pid, start time and boot (before: "dropped, process gone", and
    a second server started on the port the orphan held)."""
    models = sim_gpu_models(tmp_path / "sim-gpu", **MIB)
    del models["backends"]["lazy"]
    runtime = models["backends"]["pinned"]["runtime"]
    assert runtime["command"][:3] == ["{python}", "-m", "app.sim.vllm"]
    (tmp_path / "bin").mkdir()
    vllm = console_script(tmp_path / "bin" / "vllm")
    runtime["command"] = [str(vllm), "serve", *runtime["command"][3:]]
    state_dir = tmp_path / "var"
    pids: dict[str, int] = {}
    with killed_afterwards(pids):
        with gateway_process(models, state_dir=state_dir, wait_ready=True) as gw:
            pids["pinned"] = until_sync(lambda: pid_of(gw, "pinned"))
            cmdline = Path(f"/proc/{pids['pinned']}/cmdline").read_bytes().split(b"\0")
            assert cmdline[1] == str(vllm).encode()  # the interpreter first
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait(10)
        assert alive(pids["pinned"])
        with gateway_process(models, state_dir=state_dir) as gw:
            # Ready, or not (started anew, its memory held by the orphan: no room).
            pinned = until_sync(lambda: settled(backends(gw)["pinned"]), what="pinned settled")
            assert (pinned["state"], pinned["runtime_detail"]) == (
                "ready",
                f"pid {pids['pinned']} (adopted)",
            ), pinned["reason"]
            response = chat(gw, "pinned-model")
            assert response.status_code == 200, response.text
            stop(gw.proc)
            log = gw.log()
        assert "adopting process backend=pinned" in log
        assert "process started" not in log  # no second server
        assert "process record dropped" not in log

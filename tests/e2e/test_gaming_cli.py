"""`microscheduler yield [-- CMD]`, `restore` and `status` against a real gateway process
on a simulated GPU, run as a user runs them (a subprocess of `python -m app.cli`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    as_foreground_job,
    fake_vllm_process,
    free_port,
    gateway_process,
    sim_gpu_models,
    two_host_models,
)
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

# What the game sees: the yield held while it runs (written to a file for the test).
GAME = """
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/vram/yield") as answer:
    held = json.load(answer)
open(sys.argv[2], "w").write(json.dumps(held))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    ledger = tmp_path_factory.mktemp("gaming") / "ledger"
    with gateway_process(sim_gpu_models(ledger), wait_ready=True) as gw:
        yield gw


def cli(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    if url is not None:
        env["MICROSCHEDULER_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def yield_state(gw: GatewayProcess) -> str:
    state: str = httpx.get(gw.url + "/vram/yield").json()["state"]
    return state


def backend_state(gw: GatewayProcess, name: str) -> str:
    views = httpx.get(gw.url + "/backends").json()["backends"]
    state: str = next(v["state"] for v in views if v["name"] == name)
    return state


def test_yield_runs_the_game_then_restores_and_exits_with_its_code(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.json"
    done = cli(
        "yield", "--include-pinned", "--reason", "test game", "--",
        sys.executable, "-c", GAME + "sys.exit(7)", gateway.url, str(seen),
        url=gateway.url,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr
    held = json.loads(seen.read_text())
    assert (held["state"], held["reason"], held["stopped"]) == ("yielded", "test game", ["pinned"])
    assert held["free_mib"] == 24576  # measured on the simulated GPU: everything freed
    assert "yielded for 'test game' on GPU 0: freed 8,000 MiB, 24,576 MiB free" in done.stdout
    assert "restored: back pinned" in done.stdout
    assert yield_state(gateway) == "none"
    until_sync(lambda: backend_state(gateway, "pinned") == "ready", what="pinned back")


def test_after_the_game_a_yield_another_holds_holds_on(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    """Issue 33: `yield -- CMD` lets go of its own hold only; another's (a schedule's
    window, here taken by hand first) keeps the GPU free until it lets go too."""
    admin = {"reason": "schedule evening", "include_pinned": True}
    assert httpx.post(gateway.url + "/vram/yield", json=admin).status_code == 200
    seen = tmp_path / "seen.json"
    done = cli(
        "yield", "--reason", "test game", "--",
        sys.executable, "-c", GAME, gateway.url, str(seen), url=gateway.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert yield_state(gateway) == "yielded"  # the other hold holds on after the game
    assert json.loads(seen.read_text())["holders"] == ["schedule evening", "test game"]
    assert "yielded (already held) for 'test game' on GPU 0" in done.stdout
    let_go = "let go of the hold of 'test game'; the yield holds on for schedule evening"
    assert let_go in done.stdout
    assert httpx.get(gateway.url + "/vram/yield").json()["holders"] == ["schedule evening"]
    assert backend_state(gateway, "pinned") == "stopped"
    ended = cli("restore", url=gateway.url)  # every hold: the models come back
    assert (ended.returncode, yield_state(gateway)) == (0, "none"), ended.stderr
    until_sync(lambda: backend_state(gateway, "pinned") == "ready", what="pinned back")


def test_sigterm_reaches_the_game_and_the_gpu_is_restored(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    game = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "yield", "--url", gateway.url, "--",
         sys.executable, "-c", game],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    until_sync(started.exists, timeout_s=30, what="the game to start")
    assert yield_state(gateway) == "yielded"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "restored" in out
    assert yield_state(gateway) == "none"


def test_a_game_that_cannot_start_exits_127_and_restores(gateway: GatewayProcess) -> None:
    done = cli("yield", "--", "/nonexistent/game", url=gateway.url)
    assert done.returncode == 127
    assert "error: yield: cannot run '/nonexistent/game'" in done.stderr
    assert yield_state(gateway) == "none"


def test_memory_that_cannot_be_freed_fails_and_says_what_holds_it(
    gateway: GatewayProcess,
) -> None:
    # Pinned backends stay without --include-pinned: 16,576 MiB free, not 20,000.
    done = cli("yield", "--min-free-mib", "20000", url=gateway.url)
    assert done.returncode == 1
    assert "only 16,576 MiB free on GPU 0 after the yield, not the 20,000 MiB" in done.stderr
    assert "still holding memory: pinned (pinned; include_pinned is false)" in done.stderr
    assert "(HTTP 409)" in done.stderr
    assert yield_state(gateway) == "none"  # undone by the gateway


def test_an_ask_beyond_the_gpu_is_refused_before_anything_stops(gateway: GatewayProcess) -> None:
    done = cli("yield", "--min-free-mib", "40000", url=gateway.url)
    assert done.returncode == 1
    assert "min_free_mib 40,000 MiB is more than GPU 0 has" in done.stderr
    assert "(HTTP 400)" in done.stderr
    assert yield_state(gateway) == "none"


def test_a_game_starts_even_when_too_little_can_be_freed(gateway: GatewayProcess) -> None:
    """A launcher's game always starts: the yield is undone, a warning says why, and the
    exit code is the game's (it was 1 and no game, before)."""
    done = cli("yield", "--min-free-mib", "20000", "--", "sh", "-c", "exit 5", url=gateway.url)
    assert done.returncode == 5, done.stderr
    assert "only 16,576 MiB free on GPU 0 after the yield, not the 20,000 MiB" in done.stderr
    assert "warning: yield: the GPU was not freed" in done.stderr
    assert yield_state(gateway) == "none"


def test_an_unreachable_gateway_still_starts_the_game() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = cli("yield", "--", "sh", "-c", "exit 7", url=url)
    assert done.returncode == 7, done.stderr
    warning = f"warning: yield: the GPU was not freed (cannot reach the gateway at {url}"
    assert warning in done.stderr


def test_restore_without_a_yield_and_status(gateway: GatewayProcess) -> None:
    done = cli("restore", url=gateway.url)
    assert (done.returncode, done.stdout.strip()) == (0, "no yield was held: nothing to restore")
    status = cli("status", url=gateway.url)
    assert status.returncode == 0
    assert "GPU  name" in status.stdout
    lines = status.stdout.splitlines()
    assert any(line.split()[:2] == ["pinned", "ready"] for line in lines), status.stdout


def test_status_watch_follows_the_stream(gateway: GatewayProcess) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "status", "--watch", "--json", "--url", gateway.url],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        preexec_fn=as_foreground_job,  # Ctrl-C's SIGINT, also when the tests run in `&`
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert {b["name"] for b in first["backends"]} == {"pinned", "lazy"}
        httpx.post(gateway.url + "/backends/lazy/start", timeout=30)
        states = []
        for _ in range(200):  # the start shows up within a few updates
            update = json.loads(proc.stdout.readline())
            states.append(next(b["state"] for b in update["backends"] if b["name"] == "lazy"))
            if states[-1] == "ready":
                break
        assert states[-1] == "ready", states
        assert "starting" in states
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        httpx.post(gateway.url + "/backends/lazy/stop", timeout=30)
    assert proc.returncode == 0


def test_an_unreachable_gateway_exits_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for command in (["yield"], ["restore"], ["status"]):
        done = cli(*command, url=url)
        assert done.returncode == 3, (command, done.stderr)
        assert f"cannot reach the gateway at {url}" in done.stderr


def test_ctrl_c_ends_the_game_and_the_gpu_is_restored(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    game = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    with subprocess.Popen(
        [sys.executable, "-m", "app.cli", "yield", "--url", gateway.url, "--",
         sys.executable, "-c", game],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
        preexec_fn=as_foreground_job,  # and SIGINT not ignored, as in a terminal
    ) as proc:  # fmt: skip
        until_sync(started.exists, timeout_s=30, what="the game to start")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "restored" in out
    assert yield_state(gateway) == "none"


# -- hosts: the local machine and node-c -----------------------------------------------------


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Local: pinned (8,000 MiB) and lazy on 24 GiB; node-c: remote (12,000 MiB) on 32 GiB."""
    ledger = tmp_path_factory.mktemp("hosts") / "ledger"
    with (
        fake_vllm_process("remote-model") as remote_url,
        gateway_process(two_host_models(ledger, remote_url), wait_ready=True) as gw,
    ):
        yield gw


def held_on(gw: GatewayProcess, host: str) -> str:
    state: str = httpx.get(gw.url + "/vram/yield", params={"host": host}).json()["state"]
    return state


def test_yield_and_restore_another_host_and_status_shows_each_host(
    two_hosts: GatewayProcess,
) -> None:
    status = cli("status", url=two_hosts.url)
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()]
    assert ["host", "probe", "GPU", "name", "used", "MiB", "total", "MiB", "free", "MiB"] in rows
    assert ["local", "sim", "0", "Simulated", "GPU", "8,000", "24,576", "16,576"] in rows
    assert ["node-c", "sim", "0", "Simulated", "GPU", "12,000", "32,768", "20,768"] in rows
    remote = next(r for r in rows if r[:1] == ["remote"])
    # backend, host, state, lifecycle, in flight, waiting, GPUs, VRAM MiB
    assert remote[:8] == ["remote", "node-c", "ready", "pinned", "0", "0", "0", "12,000"]
    assert next(r for r in rows if r[:1] == ["pinned"])[:3] == ["pinned", "local", "ready"]
    assert "yield" not in status.stdout

    done = cli("yield", "--host", "node-c", "--reason", "render", url=two_hosts.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "yielded for 'render' on node-c GPU 0: freed 0 MiB, 20,768 MiB free",
        "stopped: -; slept: -",
        "restore with: microscheduler restore --host node-c",
    ]
    assert (held_on(two_hosts, "node-c"), yield_state(two_hosts)) == ("yielded", "none")
    assert backend_state(two_hosts, "pinned") == "ready"  # the local host's models stay
    status = cli("status", url=two_hosts.url)
    assert "yield on node-c: held for 'render', 20,768 MiB free" in status.stdout

    restored = cli("restore", "--host", "node-c", url=two_hosts.url)
    assert (restored.returncode, restored.stdout.strip()) == (
        0,
        "restored on node-c: back -; starting -; on demand -",
    )
    again = cli("restore", "--host", "node-c", url=two_hosts.url)
    assert again.stdout.strip() == "no yield was held on node-c: nothing to restore"
    assert held_on(two_hosts, "node-c") == "none"


def test_yield_on_another_host_runs_the_game_and_restores_that_host(
    two_hosts: GatewayProcess, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.json"
    game = (
        "import json, sys, urllib.request\n"
        "with urllib.request.urlopen(sys.argv[1]) as answer:\n"
        "    open(sys.argv[2], 'w').write(answer.read().decode())\n"
    )
    done = cli(
        "yield", "--host", "node-c", "--",
        sys.executable, "-c", game, two_hosts.url + "/vram/yield?host=node-c", str(seen),
        url=two_hosts.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = json.loads(seen.read_text())
    assert (held["state"], held["host"], held["reason"]) == ("yielded", "node-c", "gaming")
    assert "restored on node-c: back -" in done.stdout
    assert held_on(two_hosts, "node-c") == "none"


def test_a_yield_on_another_host_that_cannot_free_enough_names_that_hosts_holders(
    two_hosts: GatewayProcess,
) -> None:
    # No command: with one, it would run anyway (exit code its own, a warning).
    done = cli("yield", "--host", "node-c", "--min-free-mib", "30000", url=two_hosts.url)
    assert done.returncode == 1
    assert "only 20,768 MiB free on node-c GPU 0 after the yield, not the 30,000 MiB" in done.stderr
    # node-c's backend only: the local host's `pinned` holds nothing there.
    assert "still holding memory: remote (pinned; include_pinned is false) (HTTP" in done.stderr
    assert held_on(two_hosts, "node-c") == "none"  # undone by the gateway


def test_an_unknown_host_is_refused_naming_the_known_ones(two_hosts: GatewayProcess) -> None:
    for command in (["yield", "--host", "node-x"], ["restore", "--host", "node-x"]):
        done = cli(*command, url=two_hosts.url)
        assert done.returncode == 1, done.stderr
        assert f"error: {command[0]}: " in done.stderr
        assert "no host 'node-x' (hosts: local, node-c)" in done.stderr

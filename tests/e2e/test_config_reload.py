"""Reloading the configuration of a real gateway process: `POST /config/reload`, SIGHUP and
`--watch-config`. A stream in flight to a backend the reload leaves alone completes; a
removed process backend's server is gone; an added pinned one starts; a refused reload
lists every problem and the running configuration stays."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.test_process_adoption import alive, backends, pid_of
from tests.fakes.processes import (
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
    stop,
)
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    with fake_vllm_process("steady", "--tokens-per-second", "20") as url:
        yield url


def process_backend(model: str, **extra: Any) -> dict[str, Any]:
    port = free_port()
    return {
        "url": f"http://127.0.0.1:{port}",
        "models": [model],
        "runtime": {
            "kind": "process",
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", model],
        },
        **extra,
    }


def write(config_dir: Path, models: dict[str, Any]) -> None:
    (config_dir / "models.yaml").write_text(yaml.safe_dump(models, sort_keys=False))


def status(gw: GatewayProcess) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(gw.url + "/status", timeout=5).json()
    return found


def reload(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(gw.url + "/config/reload", timeout=60)


class Stream:
    """A chat stream read on a thread."""

    def __init__(self, url: str, model: str) -> None:
        self.begun = threading.Event()
        self.text = ""
        self.error: BaseException | None = None
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                "stream": True, "max_tokens": 60}  # fmt: skip
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                for text in r.iter_text():
                    self.text += text
                    self.begun.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.begun.set()

    def join(self) -> None:
        self._thread.join(30)
        assert not self._thread.is_alive()


def test_a_reload_adds_changes_and_removes_backends_while_a_stream_goes_on(
    tmp_path: Path, paced: str
) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models: dict[str, Any] = {
        "backends": {
            "steady": {"url": paced, "models": ["steady"]},
            "tuned": {"url": paced, "models": ["tuned-model"], "priority": 10},
            "gone": process_backend("gone-model"),
        }
    }
    write(config_dir, models)
    with gateway_process(config_dir=config_dir, wait_ready=True) as gw:
        gone_pid = until_sync(lambda: pid_of(gw, "gone"), what="the pinned process started")
        before = status(gw)["config"]
        assert before["source"] == "startup"
        stream = Stream(gw.url, "steady")
        assert stream.begun.wait(10)

        models["backends"]["tuned"]["priority"] = 70
        del models["backends"]["gone"]
        models["backends"]["fresh"] = process_backend("fresh-model")
        models["shutdown_grace_s"] = 3  # needs a restart: named, not applied
        write(config_dir, models)
        response = reload(gw)
        assert response.status_code == 200, gw.log()[-3000:]
        answer = response.json()
        assert answer["unchanged"] == ["steady"]
        assert answer["updated"] == ["tuned"]
        assert answer["removed"] == ["gone"]
        assert answer["added"] == ["fresh"]
        assert answer["restart_required"] == ["shutdown_grace_s"]

        stream.join()
        assert stream.error is None
        assert stream.text.rstrip().endswith("data: [DONE]")
        assert '"error"' not in stream.text

        until_sync(lambda: not alive(gone_pid), what="the removed backend's process gone")
        listed = backends(gw)
        assert "gone" not in listed
        assert listed["tuned"]["priority"] == 70
        until_sync(lambda: backends(gw)["fresh"]["state"] == "ready", what="fresh started")
        chat = {"model": "fresh-model", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30).is_success
        gone = {"model": "gone-model", "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(gw.url + "/v1/chat/completions", json=gone, timeout=30)
        assert refused.status_code == 404
        after = status(gw)
        assert after["config"]["source"] == "api"
        assert after["config"]["hash"] != before["hash"]
        assert after["config"]["restart_required"] == ["shutdown_grace_s"]
        assert any(e["kind"] == "config_reload" and e["result"] == "ok" for e in after["events"])
        metrics = httpx.get(gw.url + "/metrics", timeout=5).text
        assert 'microscheduler_config_reloads_total{result="ok"} 1.0' in metrics
        stop(gw.proc)
        assert "Traceback" not in gw.log()


def test_a_refused_reload_lists_every_problem_and_keeps_the_running_config(
    tmp_path: Path, paced: str
) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models = {"backends": {"steady": {"url": paced, "models": ["steady"]}}}
    write(config_dir, models)
    with gateway_process(config_dir=config_dir) as gw:
        before = status(gw)["config"]
        (config_dir / "models.yaml").write_text("backends:\n  steady: [unclosed\n")
        bad_yaml = reload(gw)
        assert bad_yaml.status_code == 400
        assert "invalid YAML" in bad_yaml.json()["error"]["message"]

        two_problems = {"backends": {
            "steady": {"url": paced, "models": ["steady"], "priority": "high"},
            "other": {"url": paced, "models": ["other"], "colour": "blue"},
        }}  # fmt: skip
        write(config_dir, two_problems)
        message = reload(gw).json()["error"]["message"]
        assert "(2 problems)" in message
        assert "backends.steady.priority" in message
        assert "backends.other.colour: unknown key" in message

        cross = {"backends": {
            "steady": {"url": paced, "models": ["steady"]},
            "twin": {"url": paced, "models": ["steady"]},
        }}  # fmt: skip
        write(config_dir, cross)
        crossed = reload(gw)
        assert crossed.status_code == 400
        assert (
            "'steady' is already served by backend 'steady'" in crossed.json()["error"]["message"]
        )

        after = status(gw)
        assert after["config"]["hash"] == before["hash"]
        assert after["config"]["last_refused"]["problems"]
        assert [b["name"] for b in after["backends"]] == ["steady"]
        chat = {"model": "steady", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}  # fmt: skip
        assert httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30).is_success
        metrics = httpx.get(gw.url + "/metrics", timeout=5).text
        assert 'microscheduler_config_reloads_total{result="refused"} 3.0' in metrics


def test_sighup_reloads_and_the_process_lives_on(tmp_path: Path, paced: str) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models: dict[str, Any] = {"backends": {"steady": {"url": paced, "models": ["steady"]}}}
    write(config_dir, models)
    with gateway_process(config_dir=config_dir) as gw:
        models["backends"]["more"] = {"url": paced, "models": ["more"]}
        write(config_dir, models)
        gw.proc.send_signal(signal.SIGHUP)
        until_sync(lambda: "more" in backends(gw), what="the backend SIGHUP added")
        assert gw.proc.poll() is None
        assert status(gw)["config"]["source"] == "sighup"


def test_watch_config_picks_up_a_change(tmp_path: Path, paced: str) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models: dict[str, Any] = {"backends": {"steady": {"url": paced, "models": ["steady"]}}}
    write(config_dir, models)
    with gateway_process(config_dir=config_dir, args=["--watch-config"]) as gw:
        models["backends"]["steady"]["aliases"] = ["calm"]
        write(config_dir, models)
        until_sync(lambda: status(gw)["config"]["source"] == "watch", what="the watched reload")
        listed = httpx.get(gw.url + "/v1/models", timeout=5).json()["data"]
        assert "calm" in {m["id"] for m in listed}


def test_a_backend_rebuilt_by_a_reload_keeps_the_gpu_profiles_block(tmp_path: Path) -> None:
    """The active GPU profile disables `off`; a reload that changes its runtime rebuilds
    it (a new object): the profile's block and yield method carry over, so the pinned
    backend is not started behind the profile's back."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models: dict[str, Any] = {"backends": {
        "on": process_backend("on-model", vram_mib=1000),
        "off": process_backend("off-model", vram_mib=1000),
    }}  # fmt: skip
    write(config_dir, models)
    (config_dir / "gpu_profiles.yaml").write_text(yaml.safe_dump({"profiles": {"quiet": {
        "models": {"off": {"enabled": False, "sleep_mode": True}},
    }}}))  # fmt: skip
    with gateway_process(config_dir=config_dir) as gw:  # not /ready: a pinned one is off
        until_sync(lambda: backends(gw)["on"]["state"] == "ready", what="on started")
        assert backends(gw)["off"]["state"] == "stopped"
        assert backends(gw)["off"]["yield_method"] == "sleep"
        models["backends"]["off"]["runtime"]["command"] += ["--max-model-len", "4096"]
        write(config_dir, models)
        response = reload(gw)
        assert response.status_code == 200, gw.log()[-3000:]
        assert response.json()["restarted"] == ["off"]
        # A start would have begun at once (in the background): give it the time to show.
        chat = {"model": "off-model", "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30)
        assert refused.status_code == 503
        assert "GPU profile 'quiet'" in refused.json()["error"]["message"]
        off = backends(gw)["off"]
        assert off["state"] == "stopped"
        assert "GPU profile 'quiet'" in str(off["blocked_by"])
        assert off["yield_method"] == "sleep"  # the profile's sleep_mode
        assert "Traceback" not in gw.log()


def test_requests_during_a_rebuild_are_held_and_served_not_refused(tmp_path: Path) -> None:
    """A reload that rebuilds a pinned backend (its command changed): the requests that
    arrive meanwhile wait, as for a wake, and are answered by the new server; before, they
    got 503 `backend_disabled` (or, with a chain, went to the paid provider)."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    models: dict[str, Any] = {"backends": {"m": process_backend("m-model")}}
    write(config_dir, models)
    chat = {"model": "m-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    statuses: list[int] = []
    done = threading.Event()

    def steady() -> None:
        with httpx.Client(base_url=gw.url, timeout=60) as client:
            while not done.is_set() and len(statuses) < 2000:
                statuses.append(client.post("/v1/chat/completions", json=chat).status_code)
                done.wait(0.02)

    with gateway_process(config_dir=config_dir, wait_ready=True) as gw:
        first = pid_of(gw, "m")
        sender = threading.Thread(target=steady, daemon=True)
        sender.start()
        until_sync(lambda: len(statuses) >= 5, what="requests flowing")
        models["backends"]["m"]["runtime"]["command"] += ["--max-model-len", "4096"]
        write(config_dir, models)
        response = reload(gw)
        assert response.status_code == 200, gw.log()[-3000:]
        assert response.json()["restarted"] == ["m"]
        until_sync(lambda: pid_of(gw, "m") not in (None, first), what="the new server")
        seen = len(statuses)
        until_sync(lambda: len(statuses) >= seen + 5, what="requests to the new server")
        done.set()
        sender.join(60)
        assert not sender.is_alive()
        assert "Traceback" not in gw.log()
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}

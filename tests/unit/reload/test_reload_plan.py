"""The plan of a configuration reload: a pure function of the running settings and the
new ones (`app.reload.plan`)."""

from __future__ import annotations

from typing import Any

from app.reload.plan import effective, plan_reload
from app.settings import Settings


def backend(port: int, model: str, **extra: Any) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:{port}", "models": [model], **extra}


def settings(backends: dict[str, Any], **top: Any) -> Settings:
    return Settings(backends=backends, access_log=False, **top)


BASE = {
    "same": backend(9001, "same"),
    "tuned": backend(9002, "tuned", priority=50),
    "moved": backend(9003, "moved"),
    "gone": backend(9004, "gone"),
}


def test_each_backend_is_unchanged_updated_restarted_removed_or_added() -> None:
    new = {
        "same": BASE["same"],
        "tuned": {**BASE["tuned"], "priority": 80, "idle_ttl_s": 30, "aliases": ["t"]},
        "moved": backend(9013, "moved"),
        "fresh": backend(9005, "fresh", max_inflight=4),
    }
    plan = plan_reload(settings(BASE), settings(new))
    assert plan.unchanged == ("same",)
    assert plan.in_place == ("tuned",)
    assert plan.restart == {"moved": ("url",)}
    assert plan.removed == ("gone",)
    assert plan.added == ("fresh",)
    assert plan.restart_required == ()
    assert plan.problems == ()
    assert plan.changed


def test_the_server_command_and_what_it_serves_need_a_restart_of_the_backend() -> None:
    process = {"kind": "process", "command": ["vllm", "serve", "m"]}
    old = settings({"b": backend(9001, "m", runtime=process)})
    flags = {**process, "command": ["vllm", "serve", "m", "--max-model-len", "4096"]}
    plan = plan_reload(old, settings({"b": backend(9001, "m", runtime=flags)}))
    assert plan.restart == {"b": ("runtime",)}
    served = plan_reload(old, settings({"b": backend(9001, "m2", runtime=process)}))
    assert served.restart == {"b": ("models",)}


def test_relay_timeouts_are_in_place_the_control_timeout_restarts() -> None:
    old = settings({"b": backend(9001, "m")})
    relay = plan_reload(old, settings({"b": backend(9001, "m")}, timeouts={"idle_s": 5}))
    assert relay.in_place == ("b",)
    assert relay.restart == {}
    control = plan_reload(old, settings({"b": backend(9001, "m")}, timeouts={"control_s": 9}))
    assert control.restart == {"b": ("timeouts.control_s",)}


def test_top_level_keys_that_need_a_gateway_restart_are_named_and_kept() -> None:
    old = settings(BASE, port=8080, health_interval_s=5)
    new = settings(BASE, port=9090, health_interval_s=1, timeouts={"connect_s": 2})
    plan = plan_reload(old, new)
    assert plan.restart_required == ("port", "health_interval_s")
    running = effective(old, new, plan)
    assert running.port == 8080
    assert running.health_interval_s == 5
    assert running.timeouts.connect_s == 2  # applied
    assert set(plan.in_place) == set(BASE)  # every backend inherits the new timeouts


def test_nothing_changed_is_an_empty_plan() -> None:
    plan = plan_reload(settings(BASE), settings(BASE))
    assert not plan.changed
    assert plan.unchanged == tuple(BASE)
    assert effective(settings(BASE), settings(BASE), plan) == settings(BASE)


def test_a_backend_on_a_host_the_gateway_does_not_run_is_a_problem() -> None:
    remote = {"node-b": {"docker": {"url": "http://127.0.0.1:2375"}, "gpu": {"probe": "none"}}}
    docker = {"kind": "docker", "container": "c"}
    new = settings(
        {**BASE, "far": backend(9009, "far", host="node-b", runtime=docker)}, hosts=remote
    )
    plan = plan_reload(settings(BASE), new)
    assert plan.restart_required == ("hosts",)
    assert plan.problems == (
        "backends.far.host: host 'node-b' is not running in this gateway (a new host "
        "needs a restart)",
    )


def test_removing_a_backend_a_running_schedule_keeps_warm_is_a_problem() -> None:
    """Schedules need a restart, so the running windows stay: one that keeps a removed
    backend warm would name a backend the gateway no longer has."""
    window = {"name": "evening", "days": ["mon"], "from": "18:00", "to": "23:00",
              "action": "keep_warm", "backend": "gone"}  # fmt: skip
    old = settings(BASE, schedules=[window])
    new = settings({k: v for k, v in BASE.items() if k != "gone"})
    plan = plan_reload(old, new)
    assert plan.removed == ("gone",)
    assert plan.problems == (
        "backends.gone: the running schedule 'evening' keeps it warm (schedules change "
        "with a restart: remove the window first, restart, then the backend)",
    )

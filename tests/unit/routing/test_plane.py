"""`build_plane`: one function builds the routing plane at start and for a reload; a
reload's plane keeps what must outlive a configuration and is otherwise new, whole."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from app.events import EventLog
from app.keys.metrics import KeyMetrics
from app.metrics import Metrics
from app.routing.plane import PlaneInputs, RoutingPlane, build_plane
from app.routing.rebuilds import Rebuilds
from app.settings import Settings


def settings(**backend: Any) -> Settings:
    config = {"url": "http://127.0.0.1:9", "models": ["m"], **backend}
    return Settings(backends={"a": config}, api_keys=(SecretStr("sk-one"),), access_log=False)


def fell_to_cloud(**fields: object) -> None:
    """The notifications' hook (`Services._fell_to_cloud`); only its identity is read."""


def inputs() -> PlaneInputs:
    registry = CollectorRegistry()
    return PlaneInputs(
        backends={},
        metrics=Metrics(registry),
        key_metrics=KeyMetrics(registry),
        events=EventLog(),
        rebuilds=Rebuilds(),
        load_of=lambda _name: None,
        on_cloud_fallback=fell_to_cloud,
    )


def test_the_start_plane_is_built_whole_from_its_settings() -> None:
    given = inputs()
    config = settings()
    plane = build_plane(config, given)
    assert plane.generation == 0
    assert plane.settings is config
    assert plane.auth.keys is plane.keys
    assert plane.dispatcher.route("m").backend == "a"
    assert plane.cloud.on_cloud_fallback is fell_to_cloud
    assert [key.on_budget for key in plane.keys.keys] == [given.events.record]


def test_a_reload_plane_keeps_what_outlives_a_configuration() -> None:
    given = inputs()
    running = build_plane(settings(), given)
    same = build_plane(settings(), given, running)
    assert same.generation == 1
    assert same.registry is not running.registry
    assert same.dispatcher is not running.dispatcher
    assert same.auth is not running.auth
    assert same.auth.keys is same.keys
    assert same.cloud is running.cloud  # its inputs did not change: circuits go on
    assert same.keys.keys == running.keys.keys  # the key objects: their use and budget
    assert same.dispatcher.response_ids is running.dispatcher.response_ids
    assert same.dispatcher.replicas is running.dispatcher.replicas


def test_a_changed_cloud_input_builds_a_new_cloud_keeping_its_counters() -> None:
    given = inputs()
    running = build_plane(settings(), given)
    renamed: RoutingPlane = build_plane(settings(aliases=["alias"]), given, running)
    assert renamed.cloud is not running.cloud
    assert renamed.cloud.metrics is running.cloud.metrics
    assert renamed.cloud.on_cloud_fallback is fell_to_cloud
    assert renamed.dispatcher.route("alias").backend == "a"
    assert running.registry.resolve("alias") is None  # the running plane is untouched

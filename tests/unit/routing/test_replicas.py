"""Replica groups: the pure pick, the registry's routes and the configuration's checks."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from app.lifecycle.state import BackendState as S
from app.metrics import Metrics
from app.routing.cloud import Cloud, build_cloud
from app.routing.registry import Registry, Route
from app.routing.replicas import MemberState, Pick, pick_replica
from app.settings import BackendConfig, Settings
from app.settings.endpoints import Api


def m(name: str, state: S = S.READY, **fields: Any) -> MemberState:
    return MemberState(name, state, **fields)


def test_the_ready_member_with_the_fewest_requests_in_flight_is_picked() -> None:
    members = [m("a", in_flight=3), m("b", in_flight=1), m("c", in_flight=2)]
    assert pick_replica(members) == Pick("b", ready=True)


def test_ties_go_to_the_fewest_waiting_in_vllm_then_the_lowest_kv_usage() -> None:
    members = [
        m("a", in_flight=1, vllm_waiting=4, kv_usage=0.1),
        m("b", in_flight=1, vllm_waiting=2, kv_usage=0.9),
        m("c", in_flight=1, vllm_waiting=2, kv_usage=0.5),
        m("d", in_flight=0, vllm_waiting=9, kv_usage=0.99),
    ]
    assert pick_replica(members).name == "d"  # type: ignore[union-attr]
    assert pick_replica(members[:3]).name == "c"  # type: ignore[union-attr]
    # Not scraped counts as nothing waiting and an empty cache.
    assert pick_replica([m("a", vllm_waiting=1), m("b")]).name == "b"  # type: ignore[union-attr]


def test_equal_members_take_turns() -> None:
    members = [m("a"), m("b"), m("c")]
    picked = [pick_replica(members, turn).name for turn in range(6)]  # type: ignore[union-attr]
    assert picked == ["a", "b", "c", "a", "b", "c"]


def test_a_ready_member_wins_over_any_to_wake_whatever_its_load() -> None:
    members = [m("a", S.STARTING), m("b", S.READY, in_flight=50), m("c", S.SLEEPING)]
    assert pick_replica(members) == Pick("b", ready=True)


def test_none_ready_joins_a_start_then_wakes_a_sleeper_then_the_cheapest_stopped() -> None:
    stopped = [m("big", S.STOPPED, footprint_mib=20000), m("small", S.STOPPED, footprint_mib=9000)]
    sleeping = m("zz", S.SLEEPING, footprint_mib=30000)
    starting = m("go", S.STARTING, footprint_mib=30000)
    assert pick_replica([*stopped, sleeping, starting]) == Pick("go", ready=False)
    assert pick_replica([*stopped, sleeping]) == Pick("zz", ready=False)
    assert pick_replica(stopped) == Pick("small", ready=False)
    # Without a known footprint: the first listed, after those with one.
    assert pick_replica([m("x", S.STOPPED), m("y", S.STOPPED)]).name == "x"  # type: ignore[union-attr]
    assert pick_replica([m("x", S.STOPPED), m("y", S.STOPPED, footprint_mib=1)]).name == "y"  # type: ignore[union-attr]


def test_a_stopped_member_with_room_now_is_started_before_a_smaller_one_that_must_evict() -> None:
    # Replicas on two hosts: local's GPU is full (the small one would evict), node-c's
    # has room for the big one.
    full = m("local-small", S.STOPPED, footprint_mib=9000, fits=False)
    room = m("node-c-big", S.STOPPED, footprint_mib=20000, fits=True)
    unknown = m("cluster", S.STOPPED, footprint_mib=1000)
    assert pick_replica([full, room]) == Pick("node-c-big", ready=False)
    assert pick_replica([full, unknown, room]).name == "node-c-big"  # type: ignore[union-attr]
    # Unknown (no telemetry) comes before one known to need an eviction.
    assert pick_replica([full, unknown]).name == "cluster"  # type: ignore[union-attr]
    # Room does not beat joining a start or waking a sleeper.
    assert pick_replica([room, m("zz", S.SLEEPING, fits=False)]).name == "zz"  # type: ignore[union-attr]


def test_blocked_members_are_skipped_and_all_blocked_is_no_pick() -> None:
    members = [m("a", blocked=True), m("b", S.STOPPED, footprint_mib=1), m("c", S.SLEEPING)]
    assert pick_replica(members) == Pick("c", ready=False)
    assert pick_replica([m("a", in_flight=9), m("b", blocked=True)]).name == "a"  # type: ignore[union-attr]
    assert pick_replica([m("a", blocked=True), m("b", S.STOPPED, blocked=True)]) is None
    assert pick_replica([]) is None


def cfg(url: str, models: list[str], **fields: Any) -> dict[str, Any]:
    return {"url": url, "models": models, **fields}


def test_a_group_routes_each_shared_name_to_its_members_and_lists_it_once() -> None:
    backends = {
        "a": BackendConfig(**cfg("http://a:1", ["qwen"], aliases=["chat"], replica_of="qwen-pool")),
        "b": BackendConfig(**cfg("http://b:1", ["qwen"], aliases=["chat"], replica_of="qwen-pool")),
        "c": BackendConfig(**cfg("http://c:1", ["other"])),
    }
    registry = Registry.from_backends(backends)
    assert registry.resolve("chat") == Route("chat", "a", "qwen", ("a", "b"), "qwen-pool")
    assert registry.resolve("chat").members == ("a", "b")  # type: ignore[union-attr]
    assert registry.resolve("other").members == ("c",)  # type: ignore[union-attr]
    assert [(e.id, e.group) for e in registry.entries] == [
        ("qwen", "qwen-pool"),
        ("chat", "qwen-pool"),
        ("other", None),
    ]
    assert registry.names_of("b") == ["qwen", "chat"]


def settings(**backends: dict[str, Any]) -> Settings:
    return Settings(backends=backends)


def test_a_name_shared_outside_a_group_is_still_an_error() -> None:
    with pytest.raises(ValidationError, match="'qwen' is already served by backend 'a'"):
        settings(a=cfg("http://a:1", ["qwen"]), b=cfg("http://b:1", ["qwen"]))
    with pytest.raises(ValidationError, match="unless the backends are replicas of one group"):
        settings(a=cfg("http://a:1", ["qwen"], replica_of="g"), b=cfg("http://b:1", ["qwen"]))
    with pytest.raises(ValidationError, match="already served"):
        settings(
            a=cfg("http://a:1", ["qwen"], replica_of="g1"),
            b=cfg("http://b:1", ["qwen"], replica_of="g2"),
        )


def test_replicas_must_send_the_same_upstream_id_and_serve_the_same_apis() -> None:
    with pytest.raises(ValidationError, match="same upstream model id"):
        settings(
            a=cfg("http://a:1", ["qwen", "chat"], replica_of="g"),
            b=cfg("http://b:1", ["llama", "chat"], replica_of="g"),
        )
    with pytest.raises(ValidationError, match="same APIs"):
        settings(
            a=cfg("http://a:1", ["qwen"], replica_of="g"),
            b=cfg("http://b:1", ["qwen"], replica_of="g", runner="pooling"),
        )
    with pytest.raises(ValidationError, match="needs a name of its own"):
        settings(a=cfg("http://a:1", ["qwen"], replica_of="b"), b=cfg("http://b:1", ["x"]))
    ok = settings(
        a=cfg("http://a:1", ["qwen"], replica_of="g"),
        b=cfg("http://b:1", ["qwen"], aliases=["q"], replica_of="g"),
    )
    assert ok.backends["b"].replica_of == "g"


def chained(entries: list[str]) -> Settings:
    member = {"models": ["qwen"], "aliases": ["chat"], "replica_of": "pool"}
    return Settings(
        backends={"a": {"url": "http://a:1", **member}, "b": {"url": "http://b:1", **member}},
        cloud_providers={
            "providers": {"cloud": {"kind": "openai", "base_url": "https://x/v1", "model": "m"}},
            "chains": {"chat": {"entries": entries}},
        },
    )


def cloud_of(configured: Settings) -> Cloud:
    registry = Registry.from_backends(configured.backends)
    return build_cloud(configured, registry, {}, Metrics(CollectorRegistry()), environ={})


def test_a_chain_entry_may_be_a_group_and_serves_what_its_members_serve(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        cloud = cloud_of(chained(["pool", "cloud"]))
    assert cloud.groups == {"pool": ("a", "b")}
    assert cloud.chain_by_model["chat"].entries == ("pool", "cloud")
    assert cloud.serves("pool", Api.CHAT)
    assert not cloud.serves("pool", Api.EMBEDDINGS)
    assert not [r for r in caplog.records if "replica group" in r.getMessage()]
    with pytest.raises(ValidationError, match=r"'pool2' is neither .* a replica group \(pool\)"):
        chained(["pool2", "cloud"])


def test_a_chain_naming_a_member_instead_of_its_group_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        cloud = cloud_of(chained(["a", "cloud"]))
    assert cloud.chain_by_model["chat"].entries == ("a", "cloud")
    warned = [r.getMessage() for r in caplog.records if "replica group" in r.getMessage()]
    assert warned == [
        "chain lists a member of a replica group, not the group: that member is asked with "
        "no replica pick chain=chat group=pool"
    ]

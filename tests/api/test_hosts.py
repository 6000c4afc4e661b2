"""`hosts:` through the gateway: the local machine and `node-c`, each with its own simulated
32 GiB GPU, fake vLLM servers on real ports. Admission, eviction, zones, the yield and
/status are per host: what runs on one host's GPU never counts against the other's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from app.gpu.ledger import LedgerWriter
from tests.api.test_lifecycle_api import backend_state, lazy, lifecycle_gateway, pinned
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, until_backend
from tests.fakes.state import saved_sections
from tests.fakes.waits import until

NODE_C = {"node-c": {"docker": {"url": "http://node-c:2375"}, "gpu": {"probe": "sim"}}}


def on_node_c(port: int, **fields: Any) -> dict[str, Any]:
    return lazy(
        port,
        host="node-c",
        runtime={"kind": "docker", "container": "vllm-c"},
        **fields,
    )


def local_and_node_c(
    *, a_mib: int, c_mib: int, **runtime: Any
) -> tuple[dict[str, dict[str, Any]], dict[str, FakeVllmRuntime]]:
    """Lazy `a` (model-a) on the local host and `c` (model-c) on node-c, and their fake
    servers (`runtime`: FakeVllmRuntime options, e.g. open_at_start=False)."""
    port_a, port_c = free_port(), free_port()
    backends = {
        "a": lazy(port_a, models=["model-a"], vram_mib=a_mib),
        "c": on_node_c(port_c, models=["model-c"], vram_mib=c_mib),
    }
    runtimes = {
        name: FakeVllmRuntime(port, models=[f"model-{name}"], **runtime)
        for name, port in (("a", port_a), ("c", port_c))
    }
    return backends, runtimes


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_each_host_admits_on_its_own_gpu(tmp_path: Path) -> None:
    # 20000 + 20000 MiB would not fit on one simulated 32768 MiB GPU
    backends, runtimes = local_and_node_c(a_mib=20000, c_mib=20000)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        for model in ("model-a", "model-c"):
            answer = await gw.client.post("/v1/chat/completions", json=chat(model))
            assert answer.status_code == 200, answer.text
        assert (await backend_state(gw, "a"))["state"] == "ready"
        assert (await backend_state(gw, "c"))["state"] == "ready"  # not evicted for a
        assert (await backend_state(gw, "c"))["host"] == "node-c"

        status = (await gw.client.get("/status")).json()
        hosts = {h["name"]: h for h in status["hosts"]}
        assert list(hosts) == ["local", "node-c"]
        assert hosts["local"]["holds"]["placed_mib"] == {"0": 20000}
        assert hosts["node-c"]["holds"]["placed_mib"] == {"0": 20000}
        assert hosts["node-c"]["backends"] == ["c"]
        assert hosts["node-c"]["gpu"]["gpus"][0]["total_mib"] == 32768

        # A zone on node-c evicts node-c's backend only, and names the host.
        acquired = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 30000, "holder": "comfyui", "host": "node-c"}
        )
        assert acquired.status_code == 200, acquired.text
        assert acquired.json()["stopped"] == ["c"]
        assert acquired.json()["host"] == "node-c"
        assert (await backend_state(gw, "a"))["state"] == "ready"
        refused = await gw.client.post("/v1/chat/completions", json=chat("model-c"))
        assert refused.status_code == 503
        assert "on node-c GPU 0" in refused.json()["error"]["message"]

        # Zone names are unique across hosts; a release finds the zone's host.
        clash = await gw.client.post("/vram/zones/img/acquire", json={"mib": 1000, "holder": "x"})
        assert clash.status_code == 409
        assert "node-c" in clash.json()["error"]["message"]
        released = await gw.client.post("/vram/zones/img/release")
        assert released.status_code == 200
        assert released.json()["unblocked"] == ["c"]

        unknown = await gw.client.post("/vram/yield", json={"host": "node-x"})
        assert unknown.status_code == 400
        assert "node-x" in unknown.json()["error"]["message"]

        yielded = await gw.client.post("/vram/yield", json={"host": "node-c"})
        assert yielded.status_code == 200, yielded.text
        assert yielded.json()["host"] == "node-c"
        assert (await backend_state(gw, "a"))["state"] == "ready"  # the local host's
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        assert (await gw.client.get("/vram/yield?host=node-c")).json()["state"] == "yielded"
        restored = await gw.client.post("/vram/restore", json={"host": "node-c"})
        assert restored.json()["restored"] is True
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_vram_yields_total{host="node-c",outcome="yielded"} 1.0' in metrics
        assert 'microscheduler_gpu_probe_up{host="node-c"} 1.0' in metrics


def runtimes_for(**ports: int) -> dict[str, FakeVllmRuntime]:
    return {name: FakeVllmRuntime(port, models=[f"model-{name}"]) for name, port in ports.items()}


async def test_a_start_on_node_c_evicts_only_node_cs_lazy_backend(tmp_path: Path) -> None:
    ports = {"a": free_port(), "c1": free_port(), "c2": free_port()}
    runtimes = runtimes_for(**ports)
    backends = {  # every lazy one is evictable by c2 (priority 60) by priority alone
        "a": lazy(ports["a"], models=["model-a"], vram_mib=20000, priority=10),
        "c1": on_node_c(ports["c1"], models=["model-c1"], vram_mib=20000, priority=10),
        "c2": on_node_c(ports["c2"], models=["model-c2"], vram_mib=20000, priority=60),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        for model in ("model-a", "model-c1"):
            answer = await gw.client.post("/v1/chat/completions", json=chat(model))
            assert answer.status_code == 200, answer.text
        answer = await gw.client.post("/v1/chat/completions", json=chat("model-c2"))
        assert answer.status_code == 200, answer.text
        assert (await backend_state(gw, "c1"))["state"] == "stopped"
        assert (await backend_state(gw, "c2"))["state"] == "ready"
        assert (await backend_state(gw, "a"))["state"] == "ready"
        assert (runtimes["a"].stops, runtimes["c1"].stops) == (0, 1)
        hosts = {h["name"]: h for h in (await gw.client.get("/status")).json()["hosts"]}
        assert hosts["local"]["holds"]["placed_mib"] == {"0": 20000}
        assert hosts["node-c"]["holds"]["placed_mib"] == {"0": 20000}
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_swaps_total{backend="c2",evicted="c1"} 1.0' in metrics
        assert 'evicted="a"' not in metrics  # never a swap candidate across hosts
        assert 'backend="a",evicted="c' not in metrics


async def test_a_start_too_big_for_node_c_is_refused_naming_node_c(tmp_path: Path) -> None:
    backends, runtimes = local_and_node_c(a_mib=1000, c_mib=40000)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        refused = await gw.client.post("/v1/chat/completions", json=chat("model-c"))
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "backend_no_vram"
        assert "needs 40000 MiB on node-c GPU 0" in error["message"]
        assert runtimes["c"].starts == 0
        # The local GPU (32768 MiB free) was never asked: a is still startable.
        answer = await gw.client.post("/v1/chat/completions", json=chat("model-a"))
        assert answer.status_code == 200


async def test_zones_of_both_hosts_survive_a_restart_and_block_their_own(
    tmp_path: Path,
) -> None:
    port_a, port_c = free_port(), free_port()
    backends = {
        "a": lazy(port_a, models=["model-a"], vram_mib=20000),
        "c": on_node_c(port_c, models=["model-c"], vram_mib=20000),
    }
    first = runtimes_for(a=port_a, c=port_c)
    async with lifecycle_gateway(backends, first, tmp_path, hosts=NODE_C) as gw:
        for model in ("model-a", "model-c"):
            assert (await gw.client.post("/v1/chat/completions", json=chat(model))).is_success
        for zone, host, mib in (("img-a", None, 30000), ("img-c", "node-c", 25000)):
            body = {"mib": mib, "holder": "comfyui", "host": host}
            acquired = await gw.client.post(f"/vram/zones/{zone}/acquire", json=body)
            assert acquired.status_code == 200, acquired.text
        assert (first["a"].stops, first["c"].stops) == (1, 1)
    saved = saved_sections(tmp_path / "var")
    assert [z["name"] for z in saved["zones"]] == ["img-a"]
    assert [z["name"] for z in saved["zones@node-c"]] == ["img-c"]

    second = runtimes_for(a=port_a, c=port_c)
    async with lifecycle_gateway(backends, second, tmp_path, hosts=NODE_C) as gw:
        local = (await gw.client.get("/vram/zones")).json()
        assert [(z["zone"], z["mib"], z["blocks"]) for z in local["zones"]] == [
            ("img-a", 30000, ["a"])
        ]
        node_c = (await gw.client.get("/vram/zones?host=node-c")).json()
        assert [(z["zone"], z["mib"], z["blocks"]) for z in node_c["zones"]] == [
            ("img-c", 25000, ["c"])
        ]
        for model in ("model-a", "model-c"):
            blocked = await gw.client.post("/v1/chat/completions", json=chat(model))
            assert blocked.json()["error"]["code"] == "backend_blocked", model
        assert (second["a"].starts, second["c"].starts) == (0, 0)
        # A restored zone's name is still unique across hosts, and its release finds it.
        clash = await gw.client.post("/vram/zones/img-c/acquire", json={"mib": 1, "holder": "x"})
        assert clash.status_code == 409
        released = await gw.client.post("/vram/zones/img-c/release")
        assert released.json()["unblocked"] == ["c"]
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-c"))).is_success
        blocked = await gw.client.post("/v1/chat/completions", json=chat("model-a"))
        assert blocked.json()["error"]["code"] == "backend_blocked"


async def test_a_yield_with_pinned_on_node_c_leaves_the_local_pinned_serving(
    tmp_path: Path,
) -> None:
    port_p, port_pc = free_port(), free_port()
    runtimes = runtimes_for(p=port_p, pc=port_pc)
    backends = {
        "p": pinned(port_p, models=["model-p"]),
        "pc": pinned(
            port_pc,
            models=["model-pc"],
            host="node-c",
            runtime={"kind": "docker", "container": "vllm-pc"},
        ),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        await until_backend(gw, "p", state="ready")
        await until_backend(gw, "pc", state="ready")
        taken = await gw.client.post("/vram/yield", json={"host": "node-c", "include_pinned": True})
        assert taken.status_code == 200, taken.text
        assert taken.json()["stopped"] == ["pc"]
        assert taken.json()["freed_mib"] == 16000
        assert runtimes["pc"].stops == 1
        refused = await gw.client.post("/v1/chat/completions", json=chat("model-pc"))
        assert refused.json()["error"]["code"] == "backend_yielded"
        served = await gw.client.post("/v1/chat/completions", json=chat("model-p"))
        assert served.status_code == 200
        assert runtimes["p"].stops == 0
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"

        restored = await gw.client.post("/vram/restore", json={"host": "node-c"})
        assert restored.json()["back"] == ["pc"]
        await until_backend(gw, "pc", state="ready")
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-pc"))).is_success
        assert (runtimes["p"].starts, runtimes["p"].stops) == (1, 0)


async def test_the_zones_listing_of_node_c_shows_its_gpu_and_zones(tmp_path: Path) -> None:
    backends, runtimes = local_and_node_c(a_mib=3000, c_mib=20000)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-c"))).is_success
        body = {"mib": 5000, "holder": "comfyui", "host": "node-c"}
        assert (await gw.client.post("/vram/zones/z/acquire", json=body)).status_code == 200
        listed = (await gw.client.get("/vram/zones?host=node-c")).json()
        assert (listed["host"], listed["probe"]) == ("node-c", "sim")
        assert listed["gpus"] == [
            {
                "gpu": 0,
                "total_mib": 32768,
                "used_mib": 25000,
                "free_mib": 32768 - 25000,
                "placed_mib": 25000,
            }
        ]
        assert [(z["zone"], z["holder"], z["mib"]) for z in listed["zones"]] == [
            ("z", "comfyui", 5000)
        ]
        local = (await gw.client.get("/vram/zones")).json()
        assert (local["host"], local["zones"]) == ("local", [])
        assert local["gpus"][0]["placed_mib"] == 0
        unknown = await gw.client.get("/vram/zones?host=node-x")
        assert unknown.status_code == 400
        assert "node-x" in unknown.json()["error"]["message"]
        assert (await gw.client.post("/vram/zones/z/release")).status_code == 200
        events = (await gw.client.get("/status")).json()["events"]
        zone_events = [(e["kind"], e["host"], e.get("gpu"))
                       for e in events if e["kind"].startswith("zone_")]  # fmt: skip
        assert zone_events == [("zone_granted", "node-c", 0), ("zone_released", "node-c", None)]


async def test_a_host_without_a_probe_admits_anything(tmp_path: Path) -> None:
    port_a, port_d = free_port(), free_port()
    runtimes = runtimes_for(a=port_a, d=port_d)
    hosts = {
        **NODE_C,
        "node-d": {"docker": {"url": "http://node-d:2375"}, "gpu": {"probe": "none"}},
    }
    backends = {
        "a": lazy(port_a, models=["model-a"], vram_mib=1000),
        "d": lazy(
            port_d,
            models=["model-d"],
            host="node-d",
            runtime={"kind": "docker", "container": "vllm-d"},
            vram_mib=90000,  # more than any simulated GPU: no telemetry, no admission
        ),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=hosts) as gw:
        answer = await gw.client.post("/v1/chat/completions", json=chat("model-d"))
        assert answer.status_code == 200, answer.text
        status = {h["name"]: h for h in (await gw.client.get("/status")).json()["hosts"]}
        assert list(status) == ["local", "node-c", "node-d"]
        assert status["node-d"]["probe"] == "none"
        assert status["node-d"]["gpu"]["gpus"] == []
        assert status["node-d"]["backends"] == ["d"]
        assert status["node-c"]["probe"] == "sim"
        listed = (await gw.client.get("/vram/zones?host=node-d")).json()
        assert (listed["probe"], listed["gpus"]) == ("none", None)
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_gpu_probe_up{host="node-d"}' not in metrics


async def test_one_zone_name_acquired_on_two_hosts_at_once_is_granted_once(
    tmp_path: Path,
) -> None:
    backends, runtimes = local_and_node_c(a_mib=20000, c_mib=20000)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        for model in ("model-a", "model-c"):  # each grant has to evict: it takes a while
            assert (await gw.client.post("/v1/chat/completions", json=chat(model))).is_success
        answers = await asyncio.gather(
            *(
                gw.client.post(
                    "/vram/zones/img/acquire", json={"mib": 30000, "holder": "x", "host": host}
                )
                for host in ("node-c", "local")
            )
        )
        assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
        granted = next(a for a in answers if a.status_code == 200).json()
        other = "local" if granted["host"] == "node-c" else "node-c"
        refusal = next(a for a in answers if a.status_code == 409).json()["error"]["message"]
        assert f"host {granted['host']!r}" in refusal
        zones = [z["zone"] for z in (await gw.client.get("/vram/zones")).json()["zones"]]
        zones += [
            z["zone"] for z in (await gw.client.get("/vram/zones?host=node-c")).json()["zones"]
        ]
        assert zones == ["img"]
        # The refused host stopped nothing for it.
        loser = "a" if other == "local" else "c"
        assert (await backend_state(gw, loser))["state"] == "ready"


async def test_a_game_on_node_c_makes_node_c_yield_by_itself_and_not_local(
    tmp_path: Path,
) -> None:
    port_a, port_c = free_port(), free_port()
    runtimes = runtimes_for(a=port_a, c=port_c)
    auto = {"enabled": True, "foreign_mib": 2000, "settle_s": 0.1, "restore_after_s": 0.3}

    def gpu(ledger: str) -> dict[str, Any]:
        ledger_dir = tmp_path / ledger
        ledger_dir.mkdir()
        return {
            "probe": "sim",
            "poll_interval_s": 0.05,
            "sim": {"ledger_dir": str(ledger_dir)},
            "auto_yield": auto,
        }

    hosts = {"node-c": {**NODE_C["node-c"], "gpu": gpu("ledger-c")}}
    backends = {
        "a": lazy(port_a, models=["model-a"]),
        "c": on_node_c(port_c, models=["model-c"]),
    }
    async with lifecycle_gateway(
        backends, runtimes, tmp_path, hosts=hosts, gpu=gpu("ledger-local")
    ) as gw:

        async def node_c_yield() -> dict[str, Any] | None:
            state: dict[str, Any] = (await gw.client.get("/vram/yield?host=node-c")).json()
            return state if state["state"] == "yielded" else None

        async def node_c_restored() -> bool:
            state = (await gw.client.get("/vram/yield?host=node-c")).json()
            return bool(state["state"] == "none")

        game = LedgerWriter(tmp_path / "ledger-c", pid=os.getpid(), gpus=[0], model="g", port=None)
        game.set_mib(4000)  # on node-c, not managed by the gateway
        held = await until(node_c_yield, timeout_s=10, what="node-c's automatic yield")
        assert held["reason"] == "auto: foreign GPU memory"
        assert held["host"] == "node-c"
        assert held["blocked"] == ["c"]
        events = (await gw.client.get("/status")).json()["events"]
        auto_yields = [e for e in events if e["kind"] == "auto_yield"]
        assert [(e["host"], e["foreign_mib"]) for e in auto_yields] == [("node-c", 4000)]
        game.remove()
        await until(node_c_restored, timeout_s=10, what="node-c's automatic restore")
        # The local host, polled as often with the same settings, saw no foreign memory.
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        kinds = [
            (e["kind"], e.get("host")) for e in (await gw.client.get("/status")).json()["events"]
        ]
        assert ("auto_yield", "local") not in kinds
        assert ("auto_restore", "node-c") in kinds
        assert (await gw.client.post("/v1/chat/completions", json=chat("model-c"))).is_success


async def test_a_yield_on_node_c_survives_a_restart_and_keeps_only_its_pinned_down(
    tmp_path: Path,
) -> None:
    port_p, port_pc = free_port(), free_port()
    backends = {
        "p": pinned(port_p, models=["model-p"]),
        "pc": pinned(
            port_pc,
            models=["model-pc"],
            host="node-c",
            runtime={"kind": "docker", "container": "vllm-pc"},
        ),
    }
    first = runtimes_for(p=port_p, pc=port_pc)
    async with lifecycle_gateway(backends, first, tmp_path, hosts=NODE_C) as gw:
        await until_backend(gw, "pc", state="ready")
        body = {"host": "node-c", "include_pinned": True, "reason": "game"}
        assert (await gw.client.post("/vram/yield", json=body)).json()["stopped"] == ["pc"]
    saved = saved_sections(tmp_path / "var")
    assert [z["name"] for z in saved["zones@node-c"]] == ["yield"]
    assert saved.get("zones", []) == []

    second = runtimes_for(p=port_p, pc=port_pc)
    async with lifecycle_gateway(backends, second, tmp_path, hosts=NODE_C) as gw:
        await until_backend(gw, "p", state="ready")  # the local pinned one comes up
        bring_up = gw.app.state.services.supervisor._start_tasks
        await until(lambda: all(t.done() for t in bring_up), what="the bring-up of both")
        held = (await gw.client.get("/vram/yield?host=node-c")).json()
        assert (held["state"], held["reason"]) == ("yielded", "game")
        assert (await gw.client.get("/vram/yield")).json()["state"] == "none"
        assert second["pc"].starts == 0  # bring-up left it down for the yield
        assert (await backend_state(gw, "pc"))["state"] == "stopped"
        restored = await gw.client.post("/vram/restore", json={"host": "node-c"})
        assert restored.json()["back"] == ["pc"]
        await until_backend(gw, "pc", state="ready")


async def test_zones_of_a_host_no_longer_configured_are_kept_and_said(
    tmp_path: Path, caplog: Any
) -> None:
    backends, runtimes = local_and_node_c(a_mib=20000, c_mib=20000)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        acquired = await gw.client.post(
            "/vram/zones/img/acquire", json={"mib": 1000, "holder": "comfyui", "host": "node-c"}
        )
        assert acquired.status_code == 200, acquired.text
    # node-c leaves the configuration: its zone stays in the file, and the start says so.
    del backends["c"]
    with caplog.at_level("WARNING"):
        async with lifecycle_gateway(backends, {"a": runtimes["a"]}, tmp_path) as gw:
            assert (await gw.client.get("/vram/zones")).json()["zones"] == []
    said = [r.getMessage() for r in caplog.records if "saved zones of a host" in r.getMessage()]
    assert said == ["saved zones of a host not in hosts: left as they are host=node-c zones=1"]
    state = saved_sections(tmp_path / "var")
    assert [zone["name"] for zone in state["zones@node-c"]] == ["img"]


async def test_a_replica_group_over_two_hosts_starts_the_member_whose_host_has_room(
    tmp_path: Path,
) -> None:
    port_p, port_a, port_c = free_port(), free_port(), free_port()
    pool = {"models": ["pool-model"], "replica_of": "pool"}
    backends = {
        # The local GPU is nearly full with a pinned model: the small local member would
        # have to evict (and may not); node-c has room for the bigger one.
        "p": pinned(port_p, vram_mib=30000),
        "r-local": lazy(port_a, vram_mib=9000, **pool),
        "r-node-c": on_node_c(port_c, vram_mib=20000, **pool),
    }
    runtimes = {
        "p": FakeVllmRuntime(port_p, models=["pinned-model"]),
        "r-local": FakeVllmRuntime(port_a, models=["pool-model"]),
        "r-node-c": FakeVllmRuntime(port_c, models=["pool-model"]),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        await until_backend(gw, "p", state="ready")
        answer = await gw.client.post("/v1/chat/completions", json=chat("pool-model"))
        assert answer.status_code == 200, answer.text
        assert runtimes["r-node-c"].starts == 1
        assert runtimes["r-local"].starts == 0
        # Not tried and refused first (the pick without room in mind did that, then
        # retried on node-c): it was never asked to start.
        assert (await backend_state(gw, "r-local"))["reason"] is None
        assert (await backend_state(gw, "p"))["state"] == "ready"
        metrics = (await gw.client.get("/metrics")).text
        assert (
            'microscheduler_replica_picks_total{backend="r-node-c",group="pool",why="woken"} 1.0'
            in metrics
        )


async def test_starts_on_two_hosts_gpu_0_run_at_once(tmp_path: Path) -> None:
    # One lock per GPU per host: node-c's GPU 0 is not the local GPU 0, so a start there
    # does not wait for a local start to finish (two vLLM servers loading at once on one
    # GPU is what the lock prevents, and these are two GPUs).
    backends, runtimes = local_and_node_c(a_mib=8000, c_mib=8000, open_at_start=False)
    async with lifecycle_gateway(backends, runtimes, tmp_path, hosts=NODE_C) as gw:
        requests = [
            asyncio.create_task(gw.client.post("/v1/chat/completions", json=chat(model)))
            for model in ("model-a", "model-c")
        ]
        # Both launched while neither listens yet: neither start waited for the other.
        await until(
            lambda: runtimes["a"].starts == 1 and runtimes["c"].starts == 1,
            what="both starts launched",
        )
        for runtime in runtimes.values():
            runtime.listening.set()
        answers = await asyncio.gather(*requests)
        assert [answer.status_code for answer in answers] == [200, 200]

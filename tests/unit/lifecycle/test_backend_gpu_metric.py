"""`microscheduler_backend_gpu{backend,host,gpu}` read from the backends at each scrape:
1 where a backend holds memory now, 0 on the GPUs it may use or left, none for a backend
the cluster places or one a reload removed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from app.lifecycle.metrics import BackendGpuCollector, Placed
from app.settings import BackendConfig


@dataclass
class FakeMemory:
    gpus: tuple[int, ...]
    holds_vram: bool = False


@dataclass
class FakeBackend:
    config: BackendConfig
    memory: FakeMemory = field(default_factory=lambda: FakeMemory((0,)))


def config(**fields: Any) -> BackendConfig:
    base = {"url": "http://127.0.0.1:9", "models": ["m"], "lifecycle": "lazy",
            "runtime": {"kind": "process", "command": ["vllm"]}, "vram_mib": 1000}  # fmt: skip
    merged = {**base, **fields}
    return BackendConfig.model_validate({k: v for k, v in merged.items() if v is not None})


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    found = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("microscheduler_backend_gpu{"):
            labels, value = line.split("} ")
            parts = dict(p.split("=") for p in labels.split("{")[1].split(","))
            assert parts["host"] == '"local"'
            found[(parts["backend"].strip('"'), parts["gpu"].strip('"'))] = float(value)
    return found


def test_a_backend_that_moves_leaves_a_0_behind_and_a_removed_one_goes() -> None:
    fixed = FakeBackend(config(gpus=[1]), FakeMemory((1,)))
    auto = FakeBackend(config(gpus="auto"))
    pods = {"kind": "kubernetes", "namespace": "n", "deployment": "d"}
    cluster = FakeBackend(config(vram_mib=None, model_info={"catalog": "qwen3-8b"}, runtime=pods))
    backends: dict[str, Placed] = {"fixed": fixed, "auto": auto, "cluster": cluster}
    registry = CollectorRegistry()
    registry.register(BackendGpuCollector(backends))
    assert samples(registry) == {("fixed", "1"): 0.0}  # auto: never placed, cluster: none

    fixed.memory.holds_vram = True
    auto.memory = FakeMemory((1,), holds_vram=True)
    assert samples(registry) == {("fixed", "1"): 1.0, ("auto", "1"): 1.0}

    auto.memory = FakeMemory((0,), holds_vram=True)  # stopped, started again on GPU 0
    assert samples(registry) == {("fixed", "1"): 1.0, ("auto", "0"): 1.0, ("auto", "1"): 0.0}

    auto.memory.holds_vram = False
    del backends["fixed"]  # a reload removed it
    assert samples(registry) == {("auto", "0"): 0.0, ("auto", "1"): 0.0}

"""`gpus:`, `tensor_parallel_size:` and Docker `placements:` as configured (issue 37)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.settings import BackendConfig
from app.settings.placement import child_gpus_env, tp_in_command


def process(*command: str, **fields: Any) -> dict[str, Any]:
    return {
        "url": "http://127.0.0.1:8001",
        "models": ["m"],
        "lifecycle": "lazy",
        "vram_mib": 8000,
        "runtime": {"kind": "process", "command": ["vllm", "serve", "m", *command]},
        **fields,
    }


def docker(**runtime: Any) -> dict[str, Any]:
    return {
        "url": "http://127.0.0.1:8001",
        "models": ["m"],
        "lifecycle": "lazy",
        "vram_mib": 8000,
        "runtime": {"kind": "docker", **runtime},
    }


def refusal(config: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        BackendConfig.model_validate(config)
    return str(caught.value)


def test_how_many_gpus_and_which() -> None:
    fixed = BackendConfig.model_validate(process(gpus=[1, 0]))
    assert (fixed.fixed_gpus, fixed.gpu_count, fixed.first_gpus) == ((1, 0), 2, (1, 0))
    auto = BackendConfig.model_validate(process(gpus="auto"))
    assert (auto.fixed_gpus, auto.gpu_count, auto.first_gpus) == (None, 1, (0,))
    by_command = BackendConfig.model_validate(process("-tp", "2", gpus="auto"))
    assert by_command.gpu_count == 2
    counted = BackendConfig.model_validate(process(gpus=2, tensor_parallel_size=2))
    assert (counted.fixed_gpus, counted.gpu_count) == (None, 2)
    assert BackendConfig.model_validate(process()).fixed_gpus == (0,)  # the default


def test_the_tensor_parallel_flag_is_read_as_vllm_spells_it() -> None:
    assert tp_in_command(["vllm", "serve", "m", "--tensor-parallel-size", "4"]) == 4
    assert tp_in_command(["vllm", "serve", "m", "--tensor-parallel-size=2"]) == 2
    assert tp_in_command(["vllm", "serve", "m", "-tp", "2"]) == 2
    assert tp_in_command(["vllm", "serve", "m"]) is None


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (process(gpus=[0, 0]), "gpus: lists a GPU twice: [0, 0]"),
        (process(gpus=[]), "gpus: lists no GPU"),
        (process(gpus=0), "greater than 0"),
        (process(gpus="any"), "gpus"),
        (process(gpus=[0], tensor_parallel_size=2), "tensor_parallel_size 2 needs 2 GPUs"),
        (process("-tp", "2", gpus=[0]), "tensor_parallel_size 2 needs 2 GPUs at once, but gpus"),
        (process("-tp", "2", tensor_parallel_size=4, gpus="auto"), "the command says"),
        (process("-tp", "x"), "-tp 'x' is not a number"),
        (process(gpus="auto", runtime={"kind": "process", "command": ["x"],
                                       "env": {"CUDA_VISIBLE_DEVICES": "1"}}),
         "the gateway sets it to the GPUs it chooses"),
        (process(gpus=[0], runtime={"kind": "process", "command": ["x"],
                                    "env": {"CUDA_VISIBLE_DEVICES": "1"}}),
         "'1' is not gpus: [0]"),
        ({**docker(container="c"), "gpus": "auto"}, "a container's GPUs are fixed when it is"),
        ({**docker(placements=[{"gpus": [0], "container": "a"}]), "gpus": [0]},
         "the gateway chooses among the placements"),
        ({**docker(placements=[{"gpus": [0, 1], "container": "a"}]), "gpus": "auto"},
         "is 2 GPU(s); the backend uses 1"),
        ({**docker(placements=[{"gpus": [0], "container": "a"},
                               {"gpus": [0], "container": "b"}]), "gpus": "auto"},
         "has a container already"),
        ({**docker(placements=[{"gpus": [0], "container": "a"},
                               {"gpus": [1], "container": "a"}]), "gpus": "auto"},
         "'a' is listed twice"),
        (docker(container="c", placements=[{"gpus": [0], "container": "a"}]), "not both"),
        (docker(), "container: is required"),
    ],
)  # fmt: skip
def test_a_placement_that_cannot_run_is_refused_in_the_configs_words(
    config: dict[str, Any], said: str
) -> None:
    assert said in refusal(config)


def test_a_docker_backend_lists_its_placements() -> None:
    config = BackendConfig.model_validate(
        {
            **docker(
                placements=[
                    {"gpus": [1], "container": "m-gpu1"},
                    {"gpus": [0], "container": "m-gpu0"},
                ]
            ),
            "gpus": "auto",
        }
    )
    runtime = config.runtime
    assert runtime.kind == "docker"
    assert runtime.container_on((0,)) == "m-gpu0"
    assert runtime.containers == ["m-gpu1", "m-gpu0"]


def test_a_child_sees_exactly_its_gpus_numbered_as_the_probe_numbers_them() -> None:
    assert child_gpus_env((1, 0), {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1,0",
    }
    own = child_gpus_env((0,), {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    assert own["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"  # the operator's choice stands

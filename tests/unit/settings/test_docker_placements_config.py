"""A Docker backend's placements in its config: where it starts when nothing chooses."""

from __future__ import annotations

from app.settings import BackendConfig


def placed(*placements: list[int]) -> BackendConfig:
    return BackendConfig.model_validate(
        {
            "url": "http://127.0.0.1:8001",
            "models": ["qwen"],
            "gpus": "auto",
            "tensor_parallel_size": len(placements[0]),
            "runtime": {
                "kind": "docker",
                "placements": [
                    {"gpus": gpus, "container": f"qwen-{i}"} for i, gpus in enumerate(placements)
                ],
            },
        }
    )


def test_its_first_gpus_are_its_first_placements() -> None:
    """Without a GPU reading to choose by, a start goes to `first_gpus`: a set no
    container was created on would be a start that cannot be made."""
    assert placed([1], [2]).first_gpus == (1,)
    assert placed([3, 2], [0, 1]).first_gpus == (2, 3)
    assert placed([0], [1]).first_gpus == (0,)

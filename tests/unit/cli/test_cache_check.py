"""`check-config`'s cache check (`app.cli.cache_check`) of a Docker backend with
placements: each placement's container is inspected and named (over an in-memory Docker
API; the real engine: tests/e2e/test_cache_check_docker.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from app.cli.cache_check import cache_warnings
from app.settings import load_settings

MODELS = """\
gpu: {probe: sim, sim: {count: 2}}
backends:
  qwen:
    url: http://127.0.0.1:8001
    models: [qwen]
    gpus: auto
    runtime:
      kind: docker
      placements:
        - {gpus: [0], container: qwen-gpu0}
        - {gpus: [1], container: qwen-gpu1}
"""
ON_A_VOLUME = [{"Type": "volume", "Destination": "/root/.cache"}]


def engine(mounts: dict[str, list[dict[str, str]]]) -> httpx.MockTransport:
    """A Docker Engine with a container of each name in `mounts` (none other)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/_ping":
            return httpx.Response(200, text="OK", headers={"Api-Version": "1.41"})
        name = request.url.path.split("/")[-2]
        if name not in mounts:
            return httpx.Response(404, json={"message": f"No such container: {name}"})
        body = {
            "Id": name,
            "Name": f"/{name}",
            "State": {"Status": "created"},
            "Config": {"Env": ["HOME=/root"]},
            "Mounts": mounts[name],
        }
        return httpx.Response(200, json=body)

    return httpx.MockTransport(answer)


def test_every_placements_container_is_checked_and_named(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(MODELS, encoding="utf-8")
    settings = load_settings(tmp_path)
    transport = engine({"qwen-gpu0": ON_A_VOLUME, "qwen-gpu1": []})

    found = cache_warnings(settings, {}, docker_transport=transport)

    assert [line.split(": ", 1)[0] for line in found] == [
        "backends.qwen.runtime.placements[1] (qwen-gpu1)",
        "backends.qwen.runtime.placements[1] (qwen-gpu1)",
    ]
    assert "vLLM's compile cache (/root/.cache/vllm) is inside the container" in found[0]


def test_a_placement_not_created_yet_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text(MODELS, encoding="utf-8")
    settings = load_settings(tmp_path)

    found = cache_warnings(settings, {}, docker_transport=engine({"qwen-gpu0": ON_A_VOLUME}))

    assert found == []

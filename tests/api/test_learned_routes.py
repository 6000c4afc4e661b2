"""What a backend serves is learned from its server (vLLM 0.33 registers routes by task:
`/classify` only for classifiers, `/v1/embeddings` only for embedders), against the fake
vLLM with `--task`: the gateway answers 404 `endpoint_not_served` without sending what
the server would 404, a chain moves on to the entry that serves it, what was learned
survives a restart, `task:` decides when the docs are off, `endpoints:` wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from tests.fakes.processes import free_port
from tests.fakes.provider import cloud_settings
from tests.fakes.servers import (
    FakeServer,
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
)
from tests.fakes.state import saved_sections

CLASSIFY = {"model": "bge", "input": "is this good?"}


async def backend_view(gw: Gateway, name: str) -> dict[str, Any]:
    listed = (await gw.client.get("/backends")).json()["backends"]
    view: dict[str, Any] = next(b for b in listed if b["name"] == name)
    return view


def embedder(url: str, **fields: Any) -> dict[str, Any]:
    return {"url": url, "models": ["bge"], "runner": "pooling", **fields}


async def test_classify_to_an_embedder_is_404_from_the_gateway_not_sent() -> None:
    async with (
        fake_vllm(models=["bge"], task="embed") as fake,
        gateway(gateway_settings({"embedder": embedder(fake.url)})) as gw,
    ):
        response = await gw.client.post("/classify", json=CLASSIFY)
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "endpoint_not_served"
        assert "/classify (classify)" in error["message"]
        assert (await fake.stats())["requests"] == []  # the fake never saw it
        embeddings = await gw.client.post("/v1/embeddings", json=CLASSIFY)
        assert embeddings.status_code == 200, embeddings.text
        view = await backend_view(gw, "embedder")
        assert view["apis_from"] == "openapi"
        assert "classify" not in view["apis"]
        assert "embeddings" in view["apis"]


async def test_a_chain_of_embedder_then_classifier_serves_classify_from_the_classifier(
    tmp_path: Path,
) -> None:
    async with (
        fake_vllm(models=["bge"], task="embed") as embed,
        fake_vllm(models=["cls"], task="classify") as classify,
    ):
        settings = cloud_settings(
            {
                "embedder": embedder(embed.url, role="pool"),
                "classifier": {"url": classify.url, "models": ["cls"], "runner": "pooling"},
            },
            {},
            {"pool": {"entries": ["embedder", "classifier"]}},
            state_dir=tmp_path,
        )
        async with gateway(settings) as gw:
            response = await gw.client.post("/classify", json=CLASSIFY)
            assert response.status_code == 200, response.text
            assert response.headers["x-microscheduler-route"] == "classifier"
            assert response.headers["x-microscheduler-fallbacks"] == (
                "1; embedder=unsupported_endpoint"
            )
            assert response.json()["data"][0]["label"]
            assert (await embed.stats())["requests"] == []
            sent = (await classify.stats())["requests"]
            assert [(r["path"], r["body"]["model"]) for r in sent] == [("/classify", "cls")]


async def test_what_was_learned_survives_a_gateway_restart(tmp_path: Path) -> None:
    async with fake_vllm(models=["bge"], task="embed", max_model_len=512) as fake:
        url = fake.url
        settings = gateway_settings({"embedder": embedder(url)}, state_dir=tmp_path)
        async with gateway(settings):
            pass
    saved = saved_sections(tmp_path)["learned"]["embedder"]
    assert saved["url"] == url
    assert saved["model"] == "bge"
    assert saved["max_model_len"] == 512
    assert ["POST", "/v1/embeddings"] in saved["routes"]
    assert ["POST", "/classify"] not in saved["routes"]
    # Its server is gone (a stopped backend): routed by what it said, not by `runner:`.
    async with gateway(settings) as gw:
        response = await gw.client.post("/classify", json=CLASSIFY)
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "endpoint_not_served"
        view = await backend_view(gw, "embedder")
        assert view["apis_from"] == "openapi"
        assert view["max_model_len"] == 512


async def test_learned_routes_of_another_server_are_not_used(tmp_path: Path) -> None:
    async with fake_vllm(models=["bge"], task="embed") as fake:
        settings = gateway_settings({"embedder": embedder(fake.url)}, state_dir=tmp_path)
        async with gateway(settings):
            pass
    moved = gateway_settings({"embedder": embedder("http://127.0.0.1:9")}, state_dir=tmp_path)
    async with gateway(moved) as gw:
        view = await backend_view(gw, "embedder")
        assert view["apis_from"] == "runner"
        assert "classify" in view["apis"]


@pytest.mark.parametrize(
    ("fields", "classify_status", "source"),
    [
        pytest.param({"task": "embed"}, 404, "task", id="task-embed"),
        pytest.param({}, 404, "runner", id="runner-pooling"),  # relayed: the fake's 404
    ],
)
async def test_with_the_docs_off_the_task_decides(
    fields: dict[str, Any], classify_status: int, source: str
) -> None:
    async with fake_vllm(models=["bge"], task="embed", disable_fastapi_docs=True) as fake:
        settings = gateway_settings({"embedder": embedder(fake.url, **fields)})
        async with gateway(settings) as gw:
            view = await backend_view(gw, "embedder")
            assert view["apis_from"] == source
            response = await gw.client.post("/classify", json=CLASSIFY)
            assert response.status_code == classify_status, response.text
            sent = [r["path"] for r in (await fake.stats())["requests"]]
            if source == "task":
                assert response.json()["error"]["code"] == "endpoint_not_served"
                assert sent == []
            else:  # every pooling route claimed: vLLM's own 404 comes back
                assert response.json() == {"detail": "Not Found"}
                assert sent == ["/classify"]


async def test_endpoints_listed_win_over_what_the_server_says() -> None:
    async with fake_vllm(models=["bge"], task="embed") as fake:
        listed = embedder(fake.url, endpoints=["classify", "tokenize"])
        async with gateway(gateway_settings({"embedder": listed})) as gw:
            view = await backend_view(gw, "embedder")
            assert view["apis_from"] == "endpoints"
            assert view["apis"] == ["classify", "tokenize"]
            refused = await gw.client.post("/v1/embeddings", json=CLASSIFY)
            assert refused.json()["error"]["code"] == "endpoint_not_served"
            relayed = await gw.client.post("/classify", json=CLASSIFY)
            assert relayed.status_code == 404  # sent as listed: the server's own 404
            assert [r["path"] for r in (await fake.stats())["requests"]] == ["/classify"]


async def stored_response(gw_client: Any, fake: FakeServer) -> str:
    created = await gw_client.post("/v1/responses", json={"model": "chat", "input": "hi"})
    assert created.status_code == 200, created.text
    response_id: str = created.json()["id"]
    return response_id


async def test_response_follow_ups_vllm_lacks_are_refused_by_the_gateway() -> None:
    async with (
        fake_vllm(models=["chat"], task="generate", max_tokens=4, responses_store=True) as fake,
        gateway(gateway_settings({"gen": {"url": fake.url, "models": ["chat"]}})) as gw,
    ):
        response_id = await stored_response(gw.client, fake)
        deleted = await gw.client.delete(f"/v1/responses/{response_id}")
        assert deleted.status_code == 405, deleted.text
        assert deleted.json()["error"]["code"] == "method_not_allowed"
        assert deleted.headers["allow"] == "GET"
        items = await gw.client.get(f"/v1/responses/{response_id}/input_items")
        assert items.status_code == 404, items.text
        assert items.json()["error"]["code"] == "endpoint_not_served"
        retrieved = await gw.client.get(f"/v1/responses/{response_id}")
        assert retrieved.status_code == 200, retrieved.text
        paths = [(r["method"], r["path"]) for r in (await fake.stats())["requests"]]
        assert paths == [
            ("POST", "/v1/responses"),
            ("GET", f"/v1/responses/{response_id}"),
        ]


async def test_a_lazy_backend_woken_for_what_it_does_not_serve_is_404_unsent(
    tmp_path: Path,
) -> None:
    """Never started before (nothing saved): routed by `runner: pooling`, which claims
    /classify; the wake learns it is an embedder, and the request is refused, not sent."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["bge"], task="embed")
    lazy = embedder(
        f"http://127.0.0.1:{port}",
        runtime={"kind": "process", "command": ["unused: the test's runtime runs it"]},
        lifecycle="lazy",
        vram_mib=1000,
    )

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtime

    settings = gateway_settings({"embedder": lazy}, state_dir=tmp_path)
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        assert (await backend_view(gw, "embedder"))["apis_from"] == "runner"
        response = await gw.client.post("/classify", json=CLASSIFY)
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "endpoint_not_served"
        assert runtime.starts == 1
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as fake:
            sent = (await fake.get("/_fake/stats")).json()["requests"]
        assert "/classify" not in [r["path"] for r in sent]
        assert (await backend_view(gw, "embedder"))["apis_from"] == "openapi"

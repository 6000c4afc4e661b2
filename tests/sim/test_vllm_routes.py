"""The fake vLLM's routes, per task and flag, against vLLM 0.33's own route table
(tests/fixtures/vllm_0_33_routes.json, extracted from vLLM's source by
tests/fixtures/vllm_routes.py): what the fake serves, vLLM serves in the same
configuration; what vLLM serves there, the fake serves or lists in NOT_FAKED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.sim.vllm import FAKE_VLLM_KEY, FakeConfig, build_app
from tests.fakes.servers import fake_vllm
from tests.fixtures.vllm_routes import routes_in

TABLE = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm_0_33_routes.json").read_text())

# vLLM routes the fake leaves out on purpose (a test of those needs a real vLLM).
NOT_FAKED = {
    ("POST", "/v1/chat/completions/batch"),
    ("POST", "/generative_scoring"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/v1/systemone"),
    ("POST", "/v1/decisions"),
    ("POST", "/invocations"),
    ("GET", "/ping"),
    ("POST", "/ping"),
    ("GET", "/load"),
    ("GET", "/kv_event_sources"),
    ("POST", "/v2/embed"),  # Cohere's embed shape
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}
# Dev-mode routes the fake leaves out (it fakes sleep, wake and the reload RPC only).
NOT_FAKED_DEV = {
    "/release_kv_cache_memory",
    "/reset_mm_cache",
    "/reset_encoder_cache",
    "/server_info",
}
# The fake's own: its test controls, and OpenAI's speech endpoint in the permissive mode.
FAKE_ONLY = {"/_fake/faults", "/_fake/stats", "/v1/audio/speech"}

DEV = "env VLLM_SERVER_DEV_MODE=1"
LORA = "env VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
DOCS = "not --disable-fastapi-docs"
SCORING_CLASSIFY = "for classify: num_labels == 1"


def vllm_routes(task: str, *, dev: bool, lora: bool, num_labels: int = 2) -> set[tuple[str, str]]:
    """(method, path) vLLM 0.33 serves for a model of ``task`` with default flags."""
    served: set[tuple[str, str]] = set()
    for route in TABLE["routes"]:
        tasks: list[str] = route["tasks"]
        requires: str | None = route["requires"]
        if tasks and task not in tasks:
            continue
        if requires is not None:
            wanted = (
                (requires == DEV and dev)
                or (requires == LORA and lora)
                or requires == DOCS
                or requires.startswith("pooling task embed")
                or (
                    requires.startswith(SCORING_CLASSIFY)
                    and (task != "classify" or num_labels == 1)
                )
            )
            if not wanted:
                continue
        if route["path"] in NOT_FAKED_DEV or route["path"].startswith("/tokenizer_info"):
            continue
        if route["file"].startswith("entrypoints/rl/"):
            continue  # the RL dev routes: not faked
        served.add((route["method"], route["path"]))
    return {r for r in served if r not in NOT_FAKED}


async def fake_routes(**options: Any) -> tuple[set[tuple[str, str]], dict[str, Any]]:
    async with fake_vllm(**options) as fake:
        doc = (await fake.client.get("/openapi.json")).json()
    # /openapi.json leaves out itself and /metrics, as vLLM's does
    routes = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    return routes | {("GET", "/openapi.json"), ("GET", "/metrics")}, doc


CASES = [
    ("generate", {}),
    ("embed", {}),
    ("classify", {}),
    ("classify", {"num_labels": 1}),
    ("transcription", {}),
]


@pytest.mark.parametrize(("task", "extra"), CASES)
@pytest.mark.parametrize(("dev", "lora"), [(False, False), (True, True)])
async def test_the_fakes_routes_are_vllms_for_the_task(
    task: str, extra: dict[str, Any], dev: bool, lora: bool
) -> None:
    served, _ = await fake_routes(task=task, dev_mode=dev, allow_runtime_lora=lora, **extra)
    expected = vllm_routes(task, dev=dev, lora=lora, num_labels=extra.get("num_labels", 2))
    assert served - expected == set(), "served by the fake, not by vLLM 0.33"
    assert expected - served == set(), "served by vLLM 0.33, not by the fake (nor NOT_FAKED)"


async def test_pooling_routes_follow_the_task() -> None:
    generate, _ = await fake_routes(task="generate")
    assert ("POST", "/v1/chat/completions") in generate
    assert not {p for _, p in generate} & {"/v1/embeddings", "/classify", "/score", "/rerank"}
    embed, _ = await fake_routes(task="embed")
    assert {("POST", "/v1/embeddings"), ("POST", "/score"), ("POST", "/rerank")} <= embed
    assert ("POST", "/classify") not in embed
    assert ("POST", "/v1/chat/completions") not in embed
    classify, _ = await fake_routes(task="classify")
    assert ("POST", "/classify") in classify
    assert ("POST", "/score") not in classify  # two labels: no scoring API
    single, _ = await fake_routes(task="classify", num_labels=1)
    assert ("POST", "/score") in single


async def test_a_route_of_another_task_is_a_404_and_a_wrong_method_a_405() -> None:
    async with fake_vllm(task="embed") as fake:
        chat = await fake.client.post("/v1/chat/completions", json={"messages": []})
        assert (chat.status_code, chat.json()) == (404, {"detail": "Not Found"})
        wrong = await fake.client.get("/v1/embeddings")
        assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
        assert wrong.headers["allow"] == "POST"


def test_json_only_routes_are_the_ones_vllm_guards() -> None:
    app = build_app(FakeConfig(port=0, dev_mode=True, allow_runtime_lora=True))
    routes = app[FAKE_VLLM_KEY].routes.routes()
    guarded = {(r["method"], r["path"]) for r in TABLE["routes"] if r["json_only"]}
    for method, path, json_only in routes:
        if path in FAKE_ONLY:
            continue
        assert json_only == ((method, path) in guarded), (method, path)


async def test_disable_fastapi_docs_removes_openapi_json() -> None:
    async with fake_vllm(disable_fastapi_docs=True) as fake:
        assert (await fake.client.get("/openapi.json")).status_code == 404
    _, doc = await fake_routes()
    assert doc["info"] == {"title": "FastAPI", "version": "0.1.0"}
    assert "/_fake/faults" not in doc["paths"]


def test_the_extractor_reads_decorators_and_add_api_route() -> None:
    source = """
from fastapi import APIRouter, Depends
router = APIRouter()

@router.post("/v1/things", dependencies=[Depends(validate_json_request)])
async def things(): ...

@router.get("/open", include_in_schema=False)
async def open_(): ...

def attach(app):
    @router.websocket("/ws")
    async def ws(): ...
    app.add_api_route("/stub", stub, methods=["POST", "PUT"], include_in_schema=False)
"""
    assert sorted(routes_in(source)) == [
        ("GET", "/open", False, False),
        ("POST", "/stub", False, False),
        ("POST", "/v1/things", True, True),
        ("PUT", "/stub", False, False),
        ("WEBSOCKET", "/ws", False, True),
    ]


def test_the_table_is_vllm_0_33s() -> None:
    assert TABLE["vllm_version"] == "0.33.0"
    paths = {(r["method"], r["path"]) for r in TABLE["routes"]}
    assert ("POST", "/v1/chat/completions") in paths
    assert ("DELETE", "/v1/responses/{response_id}") not in paths
    assert not any(p.endswith("/input_items") for _, p in paths)

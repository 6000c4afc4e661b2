"""What a backend serves: the task table against vLLM 0.33's route table
(tests/fixtures/vllm_0_33_routes.json), the OpenAPI paths the gateway maps, what a server
said (parsed, saved, read back), `runner:`/`task:` as vLLM names them, and the one body
rewrite lowering a `max_tokens` the model cannot give."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.api.protocol import PROXIED
from app.lifecycle.served import LearnedRecords, Served
from app.lifecycle.store import StateStore
from app.routing.exchange import Call
from app.routing.local import local_body
from app.routing.registry import Route
from app.settings import BackendConfig
from app.settings.endpoints import API_PATHS, TASK_APIS, Api, apis_of_paths
from app.upstreams.vllm_learned import Learned, max_model_len_of, routes_of_openapi
from tests.unit.lifecycle.test_backend_lifecycle import GatedRuntime, make_backend

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm_0_33_routes.json"


def vllm_paths(task: str) -> set[str]:
    """The paths vLLM 0.33 registers for a model of `task` with no optional flag or env."""
    routes = json.loads(FIXTURE.read_text())["routes"]
    found = set()
    for route in routes:
        every = route["tasks"] == []
        requires = route["requires"]
        plain = (
            requires is None
            or (task == "embed" and requires.startswith("pooling task embed"))
            or (task != "classify" and requires.startswith("for classify:"))  # num_labels
        )
        if (every or task in route["tasks"]) and plain and route["method"] != "WEBSOCKET":
            found.add(route["path"])
    return found


@pytest.mark.parametrize("task", sorted(TASK_APIS))
def test_each_tasks_apis_are_the_routes_vllm_registers_for_it(task: str) -> None:
    assert apis_of_paths(vllm_paths(task)) == TASK_APIS[task]


def test_every_proxied_path_maps_to_its_api() -> None:
    for endpoint in PROXIED:
        assert API_PATHS[endpoint.path] is endpoint.api


def test_an_openapi_document_gives_routes_and_apis() -> None:
    doc = {
        "openapi": "3.1.0",
        "paths": {
            "/v1/embeddings": {"post": {}},
            "/v1/responses/{response_id}": {"get": {}, "parameters": []},
            "/health": {"get": {}},
            "not-a-path": {"get": {}},
        },
    }
    routes = routes_of_openapi(json.dumps(doc).encode())
    assert routes == {
        ("POST", "/v1/embeddings"),
        ("GET", "/v1/responses/{response_id}"),
        ("GET", "/health"),
    }
    learned = Learned(routes, 8192)
    assert learned.serves_route("GET", "/v1/responses/resp_1?x=1") is True
    assert learned.serves_route("DELETE", "/v1/responses/resp_1") is False
    assert learned.serves_route("GET", "/v1/responses/resp_1/input_items") is False
    assert learned.methods_of("/v1/responses/resp_1") == ["GET"]
    assert Learned(None, None).serves_route("GET", "/x") is None
    assert Learned.from_json(learned.to_json()) == learned
    junk: object
    for junk in ({"routes": [["GET"]]}, {"routes": None, "max_model_len": True}, [], "x"):
        assert Learned.from_json(junk) is None


def test_max_model_len_is_the_served_models_card() -> None:
    body = json.dumps(
        {
            "data": [
                {"id": "lora-a", "max_model_len": None, "parent": "base"},
                {"id": "other", "max_model_len": 4096},
                {"id": "base", "max_model_len": 8192},
            ]
        }
    ).encode()
    assert max_model_len_of(body, ["base"]) == 8192
    assert max_model_len_of(body, ["unknown"]) == 4096
    assert max_model_len_of(b"not json", ["base"]) is None


def config(**fields: Any) -> BackendConfig:
    return BackendConfig(**{"url": "http://vllm:8000", "models": ["m"], **fields})


def test_endpoints_then_learned_then_task_then_runner() -> None:
    embed_routes = Learned(frozenset({("POST", "/v1/embeddings"), ("POST", "/pooling")}), 512)
    assert Served(config(runner="pooling")).source == "runner"
    assert Api.CLASSIFY in Served(config(runner="pooling")).apis
    assert Served(config(task="embed")).apis == TASK_APIS["embed"]
    served = Served(config(task="classify"))
    assert served.learn(embed_routes) is True
    assert served.source == "openapi"
    assert served.apis == {Api.EMBEDDINGS, Api.POOLING}
    assert served.learn(embed_routes) is False
    docs_off = Served(config(task="embed"), Learned(None, 512))
    assert (docs_off.source, docs_off.max_model_len) == ("task", 512)
    listed = Served(config(endpoints=["classify"]), embed_routes)
    assert listed.source == "endpoints"
    assert listed.apis == {Api.CLASSIFY}


def test_learned_is_saved_for_its_url_and_model(tmp_path: Path) -> None:
    records = LearnedRecords(StateStore(tmp_path))
    learned = Learned(frozenset({("POST", "/classify")}), 2048)
    records.put("b", config(), learned)
    again = LearnedRecords(StateStore(tmp_path))  # a restart reads the file
    assert again.get("b", config()) == learned
    assert again.get("b", config(url="http://elsewhere:8000")) is None
    assert again.get("b", BackendConfig(url="http://vllm:8000", models=["n"])) is None


def test_runner_takes_vllms_values_and_transcription_is_a_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        old = config(runner="transcription")
    assert (old.runner, old.task) == ("generate", "transcription")
    assert old.apis == TASK_APIS["transcription"]
    assert "runner: transcription is deprecated" in caplog.text
    assert config(task="embed").runner == "pooling"
    with pytest.raises(ValidationError, match="runs on vLLM's pooling runner"):
        config(runner="generate", task="classify")
    with pytest.raises(ValidationError, match="contradicts task: embed"):
        config(runner="transcription", task="embed")
    with pytest.raises(ValidationError):
        config(runner="draft")


ROUTE = Route(name="alias", backend="b", upstream_model="m")


def messages_call(payload: dict[str, Any]) -> Call:
    raw = json.dumps(payload).encode()
    return Call(ROUTE, "/v1/messages", payload, False, raw, {}, api=Api.MESSAGES)


def learned_backend(max_model_len: int | None, **fields: Any) -> Any:
    backend = make_backend(GatedRuntime(), **fields)
    backend.serving.learn(Learned(None, max_model_len))
    return backend


def test_a_native_messages_body_is_lowered_with_its_thinking_budget() -> None:
    payload = {
        "model": "alias",
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
        "messages": [],
    }
    body, said = local_body(learned_backend(8192), messages_call(payload), b"unused")
    assert said == b"32000->8192"
    assert json.loads(body) == {
        **payload,
        "model": "m",
        "max_tokens": 8192,
        "thinking": {"type": "enabled", "budget_tokens": 8191},
    }


@pytest.mark.parametrize(
    ("max_model_len", "fields"),
    [(None, {}), (8192, {"lower_max_tokens": False}), (40000, {})],
)
def test_a_body_is_sent_as_it_is_when_nothing_is_lowered(
    max_model_len: int | None, fields: dict[str, Any]
) -> None:
    call = messages_call({"model": "m", "max_tokens": 32000, "messages": []})
    body, said = local_body(learned_backend(max_model_len, **fields), call, call.body)
    assert (body, said) == (call.body, None)


def test_priority_and_lowering_are_one_rewrite() -> None:
    payload = {"model": "alias", "messages": [], "max_tokens": 9000, "priority": -5}
    raw = json.dumps(payload).encode()
    call = Call(ROUTE, "/v1/chat/completions", payload, False, raw, {}, api=Api.CHAT)
    backend = learned_backend(4096, scheduling="priority")
    body, said = local_body(backend, call, raw)
    assert said == b"9000->4096"
    assert json.loads(body) == {"model": "m", "messages": [], "max_tokens": 4096, "priority": 0}

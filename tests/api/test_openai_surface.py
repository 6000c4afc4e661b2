"""The rest of the OpenAI surface through the gateway, with the official SDK where it has
the call: responses (and their follow-ups), audio, and vLLM's rerank/score/tokenize."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.fakes.servers import (
    FakeServer,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    sdk_http,
    serve_app,
)

EVERYTHING = ["chat", "responses", "embeddings", "tokenize", "detokenize", "rerank", "score",
              "classify", "pooling", "transcriptions", "translations", "speech"]  # fmt: skip


@dataclass
class World:
    gw: Gateway
    sdk: openai.AsyncOpenAI
    upstream: FakeServer
    chat: FakeServer  # a vLLM with the generate task: chat, completions, responses


@pytest.fixture
async def w() -> AsyncIterator[World]:
    async with (
        fake_vllm(models=["served-model"], max_tokens=4, responses_store=True) as upstream,
        fake_vllm(models=["chat-only"], max_tokens=4, task="generate") as chat,
    ):
        settings = gateway_settings(
            {
                "omni": {
                    "url": upstream.url,
                    "models": ["served-model"],
                    "aliases": ["omni"],
                    "endpoints": EVERYTHING,
                },
                "chatty": {"url": chat.url, "models": ["chat-only"]},  # runner generate
            }
        )
        async with gateway(settings) as gw, sdk_http(gw) as http:
            sdk = openai.AsyncOpenAI(
                base_url="http://gateway/v1", api_key="unused", http_client=http, max_retries=0
            )
            yield World(gw, sdk, upstream, chat)


async def upstream_requests(w: World) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = (await w.upstream.stats())["requests"]
    return requests


async def test_responses_create_and_retrieve_reach_the_backend_that_made_them(
    w: World,
) -> None:
    created = await w.sdk.responses.create(model="omni", input="Say hello")
    assert created.id.startswith("resp_")
    assert created.output_text
    sent = (await upstream_requests(w))[-1]
    assert sent["path"] == "/v1/responses"
    assert sent["body"]["model"] == "served-model"  # the alias was put in

    again = await w.sdk.responses.retrieve(created.id)
    assert again.id == created.id
    assert again.output_text == created.output_text
    assert (await upstream_requests(w))[-1]["path"] == f"/v1/responses/{created.id}"

    # vLLM has no DELETE: the gateway answers it (tests/api/test_responses_store.py)
    before = len(await upstream_requests(w))
    deleted = await w.gw.client.delete(f"/v1/responses/{created.id}")
    assert deleted.status_code == 405
    assert len(await upstream_requests(w)) == before


async def test_a_streamed_response_is_relayed_event_by_event_and_remembered(w: World) -> None:
    events = [event async for event in await w.sdk.responses.create(
        model="omni", input="Stream please", stream=True)]  # fmt: skip
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert "response.output_text.delta" in types
    assert types[-1] in ("response.completed", "response.incomplete")
    created = events[0]
    assert created.type == "response.created"
    retrieved = await w.sdk.responses.retrieve(created.response.id)
    assert retrieved.id == created.response.id


async def test_an_unknown_response_id_is_404_without_asking_any_backend(w: World) -> None:
    before = len(await upstream_requests(w))
    with pytest.raises(openai.NotFoundError) as info:
        await w.sdk.responses.retrieve("resp_never_made")
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "response_not_found"
    assert len(await upstream_requests(w)) == before


async def test_audio_transcription_uploads_are_routed_by_their_form_and_relayed_unchanged(
    w: World,
) -> None:
    audio = b"RIFF" + bytes(range(256)) * 40
    text = await w.sdk.audio.transcriptions.create(model="omni", file=("a.wav", audio))
    assert text.text.startswith("fake transcript of a")
    assert f"{len(audio)} byte" in text.text  # the fake read the very same file
    streamed = await w.sdk.audio.transcriptions.create(
        model="omni", file=("a.wav", audio), stream=True
    )
    deltas = [e async for e in streamed]
    assert deltas
    # The SDK deprecates its translations call; the route is the same upload.
    translation = await w.gw.client.post(
        "/v1/audio/translations", data={"model": "omni"}, files={"file": ("a.wav", audio)}
    )
    assert translation.status_code == 200, translation.text
    assert translation.json()["text"].startswith("fake transcript of a")
    assert (await upstream_requests(w))[-1]["path"] == "/v1/audio/translations"


async def test_speech_is_streamed_as_binary(w: World) -> None:
    speech = await w.sdk.audio.speech.create(
        model="omni", voice="alloy", input="hello there", response_format="wav"
    )
    data = speech.content
    assert data.startswith(b"RIFF")
    assert len(data) > 8192  # several chunks


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
async def test_rerank_under_each_of_vllms_paths(w: World, path: str) -> None:
    response = await w.gw.client.post(
        path,
        json={
            "model": "omni",
            "query": "red fox",
            "documents": ["a blue whale", "the red fox runs", "fox"],
        },
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert results[0]["document"]["text"] == "the red fox runs"
    assert (await upstream_requests(w))[-1]["path"] == path


async def test_score_tokenize_and_detokenize(w: World) -> None:
    score = await w.gw.client.post(
        "/score", json={"model": "omni", "text_1": "red fox", "text_2": "red fox"}
    )
    assert score.status_code == 200, score.text
    assert score.json()["data"][0]["score"] > 0
    tokens = await w.gw.client.post("/tokenize", json={"model": "omni", "prompt": "hello world"})
    assert tokens.status_code == 200, tokens.text
    body = tokens.json()
    assert body["count"] == len(body["tokens"]) > 0
    text = await w.gw.client.post("/detokenize", json={"model": "omni", "tokens": body["tokens"]})
    assert text.status_code == 200, text.text
    assert "hello" in text.json()["prompt"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ("/v1/audio/speech", {"input": "hi", "voice": "alloy"}),
        ("/v1/embeddings", {"input": "hi"}),
    ],
)
async def test_what_a_generate_runner_does_not_serve_is_a_clear_404(
    w: World, path: str, body: dict[str, Any]
) -> None:
    response = await w.gw.client.post(path, json={"model": "chat-only", **body})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "endpoint_not_served"
    assert "runner" in error["message"]
    assert (await w.chat.stats())["requests"] == []


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rerank", {"model": "omni"}, "query"),
        ("/detokenize", {"model": "omni", "tokens": "1 2"}, "tokens"),
        ("/tokenize", {"prompt": "no model"}, "model"),
    ],
)
async def test_bad_bodies_get_openai_errors_naming_the_param(
    w: World, path: str, body: dict[str, Any], param: str
) -> None:
    response = await w.gw.client.post(path, content=json.dumps(body))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_images_go_to_a_backend_that_lists_them() -> None:
    seen: list[tuple[str, str, bytes]] = []

    async def images(request: web.Request) -> web.Response:
        seen.append((request.path, request.content_type, await request.read()))
        return web.json_response({"created": 1, "data": [{"b64_json": "aW1n"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/images/generations", images)
    app.router.add_post("/v1/images/edits", images)
    async with serve_app(app) as url:
        settings = gateway_settings(
            {"painter": {"url": url, "models": ["flux"], "endpoints": ["images"]}}
        )
        async with gateway(settings) as gw:
            made = await gw.client.post(
                "/v1/images/generations", json={"model": "flux", "prompt": "a fox"}
            )
            assert made.status_code == 200, made.text
            assert made.json()["data"][0]["b64_json"] == "aW1n"
            edited = await gw.client.post(
                "/v1/images/edits",
                data={"model": "flux", "prompt": "redder"},
                files={"image": ("fox.png", b"\x89PNG fake")},
            )
            assert edited.status_code == 200, edited.text
            chat = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "flux", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert chat.json()["error"]["code"] == "endpoint_not_served"
    assert [path for path, _, _ in seen] == ["/v1/images/generations", "/v1/images/edits"]
    assert seen[1][1] == "multipart/form-data"
    assert b"\x89PNG fake" in seen[1][2]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # vLLM 0.33's chat form of a pooling request (pooling/base/protocol.py ChatRequestMixin)
        ("/v1/embeddings", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/classify", {"messages": [{"role": "user", "content": "hi"}]}),
        # a multimodal rerank query (pooling/scoring/typing.py ScoreMultiModalParam)
        (
            "/v1/rerank",
            {
                "query": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
                "documents": ["a red fox"],
            },
        ),
    ],
)
async def test_what_vllm_accepts_is_relayed_not_refused(
    w: World, path: str, body: dict[str, Any]
) -> None:
    before = len(await upstream_requests(w))
    response = await w.gw.client.post(path, json={"model": "omni", **body})
    assert response.json().get("error", {}).get("code") != "invalid_request_error", response.text
    sent = await upstream_requests(w)
    assert len(sent) == before + 1, response.text
    assert sent[-1]["path"] == path
    assert sent[-1]["body"] == {"model": "served-model", **body}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/embeddings", {}, "Missing required parameter: 'input' (or 'messages')."),
        ("/classify", {"messages": "hi"}, "'messages'"),
        ("/v1/rerank", {"query": 3, "documents": ["d"]}, "a string or an object"),
    ],
)
async def test_neither_form_is_a_clear_400(
    w: World, path: str, body: dict[str, Any], message: str
) -> None:
    response = await w.gw.client.post(path, json={"model": "omni", **body})
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]

"""The gateway labels the JSON it sends upstream `application/json` whatever the client
wrote: vLLM's JSON routes refuse any other content type with a 400
(`validate_json_request`), and the fake vLLM does too. A multipart form keeps its label
and boundary."""

from __future__ import annotations

import json

import pytest

from tests.api.test_openai_api import CHAT, one_backend
from tests.fakes.servers import fake_vllm, gateway, gateway_settings

BODY = json.dumps(CHAT).encode()


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/x-www-form-urlencoded"},  # curl -d
        {"content-type": "text/plain"},
        {},  # none: aiohttp would say application/octet-stream
    ],
    ids=["form", "text", "none"],
)
async def test_json_labelled_anything_reaches_the_strict_fake_and_is_served(
    headers: dict[str, str],
) -> None:
    async with fake_vllm(models=["nemotron-8b"], max_tokens=4) as upstream:
        async with gateway(one_backend(upstream.url)) as gw:
            response = await gw.client.post("/v1/chat/completions", content=BODY, headers=headers)
            assert response.status_code == 200, response.text
            assert response.json()["object"] == "chat.completion"
        sent = (await upstream.stats())["requests"][-1]
        assert sent["headers"]["content-type"] == "application/json"


async def test_a_multipart_form_keeps_its_boundary() -> None:
    async with fake_vllm(models=["whisper"], task="transcription") as upstream:
        backend = {
            "url": upstream.url,
            "models": ["whisper"],
            "aliases": ["default"],
            "endpoints": ["transcriptions"],
        }
        async with gateway(gateway_settings({"speech": backend})) as gw:
            response = await gw.client.post(
                "/v1/audio/transcriptions",
                data={"model": "default"},
                files={"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")},
            )
        sent = (await upstream.stats())["requests"][-1]
    assert response.status_code == 200, response.text
    assert sent["headers"]["content-type"].startswith("multipart/form-data; boundary=")

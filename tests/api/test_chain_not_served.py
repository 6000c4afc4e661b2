"""A fallback chain none of whose entries serves the API asked for answers 404
`endpoint_not_served`, as a single backend does, naming the chain and what its entries
serve (a 503 `fallback_exhausted` would have SDKs retry what can never work); a chain
whose entry serves the API but fails still answers 503."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.test_fallback_triggers import world

WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)


async def test_a_chain_whose_entries_serve_only_chat_answers_404_for_audio(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={"endpoints": ["chat"]},
        cloud={"endpoints": ["chat", "completions"]},
    ) as w:
        response = await w.gw.client.post(
            "/v1/audio/transcriptions",
            data={"model": "reasoning"},
            files={"file": ("a.wav", WAV, "audio/wav")},
        )
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "endpoint_not_served"
        assert error["type"] == "invalid_request_error"
        message = error["message"]
        assert "fallback chain 'reasoning'" in message
        assert "/v1/audio/transcriptions (transcriptions)" in message
        assert "reasoning serves chat; cloud serves chat, completions" in message
        assert "retry-after" not in response.headers
        assert (await w.local.stats())["requests"] == []
        assert (await w.cloud.stats())["requests"] == []


async def test_a_chain_whose_entry_serves_the_api_but_fails_still_answers_503(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={"endpoints": ["chat", "embeddings"]},
        cloud={"endpoints": ["chat"]},
    ) as w:
        await w.local.client.post("/_fake/faults", json={"fail_status": 500, "fail_count": 1})
        response = await w.gw.client.post(
            "/v1/embeddings", json={"model": "reasoning", "input": "hello"}
        )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "fallback_exhausted"

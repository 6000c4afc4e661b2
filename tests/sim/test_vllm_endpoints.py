"""The fake vLLM server's other OpenAI-compatible endpoints: Responses, tokenizer, pooling
runner (rerank, score, pooling, classify) and audio, checked with the official SDK where it
has a method (it parses the bodies into its typed objects) and httpx otherwise."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from app.sim.audio import transcript
from app.sim.vllm import FakeConfig, FakeVllmServer

MODELS = ["m1", "m2"]


@pytest.fixture
async def server() -> AsyncIterator[FakeVllmServer]:
    async with FakeVllmServer(FakeConfig(port=0, models=MODELS, responses_store=True)) as srv:
        yield srv


@pytest.fixture
async def client(server: FakeVllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
        yield c


@pytest.fixture
async def sdk(server: FakeVllmServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


async def stats(client: httpx.AsyncClient) -> dict[str, Any]:
    data: dict[str, Any] = (await client.get("/_fake/stats")).json()
    return data


async def set_faults(client: httpx.AsyncClient, **faults: Any) -> None:
    assert (await client.post("/_fake/faults", json=faults)).status_code == 200


def assert_error(resp: httpx.Response, status: int, err_type: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    if err_type is not None:
        assert error["type"] == err_type


# --- /v1/responses -----------------------------------------------------------------------------


async def test_responses_create_like_chat(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    resp = await sdk.responses.create(model="m1", input="alpha beta gamma", instructions="be kind")
    chat = await sdk.chat.completions.create(
        model="m1",
        messages=[
            {"role": "system", "content": "be kind"},
            {"role": "user", "content": "alpha beta gamma"},
        ],
    )
    assert resp.id.startswith("resp_")
    assert resp.object == "response"
    assert resp.status == "completed"
    assert resp.model == "m1"
    assert resp.instructions == "be kind"
    assert resp.output_text == chat.choices[0].message.content
    assert resp.output[0].type == "message"
    assert resp.output[0].role == "assistant"
    assert resp.usage is not None
    assert chat.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens == 5
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.input_tokens_details.cached_tokens == 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    raw = (await client.get(f"/v1/responses/{resp.id}")).json()
    for key in ("parallel_tool_calls", "tool_choice", "tools", "top_p", "temperature"):
        assert key in raw
    assert raw["truncation"] == "disabled"
    assert raw["service_tier"] == "auto"
    assert (await stats(client))["completed"] == 2


async def test_responses_items_and_max_output_tokens(sdk: openai.AsyncOpenAI) -> None:
    resp = await sdk.responses.create(
        model="m2",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "one two"}]},
            {"role": "assistant", "content": "three"},
            {"role": "user", "content": "red blue"},
        ],
        max_output_tokens=3,
    )
    assert resp.output_text == "red blue red"
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.max_output_tokens == 3
    assert resp.usage is not None
    assert resp.usage.input_tokens == 5


async def test_responses_stream_event_sequence(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    stream = await sdk.responses.create(model="m1", input="x y", stream=True, max_output_tokens=3)
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "x y x"
    done = events[-1]
    assert done.type == "response.completed"
    assert done.response.output_text == "x y x"
    assert events[0].type == "response.created"
    assert events[0].response.status == "in_progress"
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {done.response.output[0].id}
    # stored after streaming too
    again = await sdk.responses.retrieve(done.response.id)
    assert again.output_text == "x y x"
    async with client.stream("POST", "/v1/responses", json={"input": "a", "stream": True}) as r:
        raw = (await r.aread()).decode()
    first = raw.split("\n\n")[0].split("\n")
    assert first[0] == "event: response.created"
    assert first[1].startswith("data: {")
    assert "[DONE]" not in raw


async def test_responses_store_retrieve_cancel() -> None:
    """vLLM 0.33's route set (vllm/entrypoints/openai/responses/api_router.py): no DELETE
    (405, as Starlette answers a known path), no input_items (404)."""
    config = FakeConfig(port=0, models=MODELS, task="generate", responses_store=True)
    async with (
        FakeVllmServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5) as client,
        openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as sdk,
    ):
        await _store_retrieve_cancel(sdk, client)


async def test_the_permissive_mode_also_deletes_as_openai_does(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    resp = await sdk.responses.create(model="m1", input="hello")
    deleted = await client.delete(f"/v1/responses/{resp.id}")
    assert deleted.json() == {"id": resp.id, "object": "response", "deleted": True}
    assert_error(await client.get(f"/v1/responses/{resp.id}"), 404)


async def _store_retrieve_cancel(sdk: openai.AsyncOpenAI, client: httpx.AsyncClient) -> None:
    resp = await sdk.responses.create(model="m1", input="hello")
    got = await sdk.responses.retrieve(resp.id)
    assert got.id == resp.id
    assert got.output_text == resp.output_text
    cancel = await client.post(f"/v1/responses/{resp.id}/cancel")
    assert_error(cancel, 400, "invalid_request_error")
    assert cancel.json()["error"]["message"] == "Cannot cancel a synchronous response."
    deleted = await client.delete(f"/v1/responses/{resp.id}")
    assert (deleted.status_code, deleted.json()) == (405, {"detail": "Method Not Allowed"})
    assert deleted.headers["allow"] == "GET, HEAD"
    items = await client.get(f"/v1/responses/{resp.id}/input_items")
    assert (items.status_code, items.json()) == (404, {"detail": "Not Found"})
    assert (await client.get(f"/v1/responses/{resp.id}")).status_code == 200
    missing = await client.get("/v1/responses/resp_gone")
    assert_error(missing, 404, "invalid_request_error")
    assert missing.json()["error"]["message"] == "Response with id 'resp_gone' not found."
    assert_error(await client.post("/v1/responses/resp_nope/cancel"), 404)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve("resp_nope")
    unstored = await sdk.responses.create(model="m1", input="hello", store=False)
    assert_error(await client.get(f"/v1/responses/{unstored.id}"), 404)


async def test_responses_validation_and_faults(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/responses", json={"model": "m1"}), 400)
    bad_model = await client.post("/v1/responses", json={"model": "zz", "input": "a"})
    assert_error(bad_model, 404, "NotFoundError")
    body = {"input": "a", "max_output_tokens": 0}
    assert_error(await client.post("/v1/responses", json=body), 400)
    assert_error(await client.post("/v1/responses", json={"input": 5}), 400)
    await set_faults(client, fail_status=503, fail_count=1)
    assert_error(await client.post("/v1/responses", json={"input": "a"}), 503)
    assert (await client.post("/v1/responses", json={"input": "a"})).status_code == 200
    data = await stats(client)
    assert data["failed"] == 1
    assert data["completed"] == 1
    assert data["requests"][-1]["path"] == "/v1/responses"


# --- /tokenize, /detokenize ---------------------------------------------------------------------


async def test_tokenize_count_matches_usage(
    client: httpx.AsyncClient, sdk: openai.AsyncOpenAI
) -> None:
    prompt = "the quick brown fox"
    tok = (await client.post("/tokenize", json={"model": "m1", "prompt": prompt})).json()
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tok["max_model_len"] == 8192
    assert tok["token_strs"] is None
    assert len(tok["tokens"]) == tok["count"]
    completion = await sdk.completions.create(model="m1", prompt=prompt)
    assert completion.usage is not None
    assert tok["count"] == completion.usage.prompt_tokens == 4
    messages = [{"role": "system", "content": "hi"}, {"role": "user", "content": "a b c"}]
    chat_tok = await client.post(
        "/tokenize",
        json={"messages": messages, "add_generation_prompt": True, "return_token_strs": True},
    )
    chat = await client.post("/v1/chat/completions", json={"messages": messages})
    assert chat_tok.json()["count"] == chat.json()["usage"]["prompt_tokens"] == 4
    assert chat_tok.json()["token_strs"] == ["hi", "a", "b", "c"]
    detok = await client.post("/detokenize", json={"tokens": tok["tokens"]})
    assert detok.json() == {"prompt": prompt}


async def test_tokenize_errors(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/tokenize", json={"model": "m1"}), 400)
    assert_error(await client.post("/tokenize", json={"model": "x", "prompt": "a"}), 404)
    both = {"messages": [], "add_generation_prompt": True, "continue_final_message": True}
    assert_error(await client.post("/tokenize", json=both), 400)
    assert_error(await client.post("/detokenize", json={"tokens": [-1]}), 400)
    assert_error(await client.post("/detokenize", json={}), 400)


# --- rerank, score, pooling, classify ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_sorted_by_overlap(client: httpx.AsyncClient, path: str) -> None:
    docs = ["green pear", "red apple pie", "apple", "red apple"]
    body = {"model": "m2", "query": "red apple", "documents": docs, "top_n": 3}
    resp = await client.post(path, json=body)
    assert resp.status_code == 200
    data = resp.json()
    assert set(data) == {"id", "model", "usage", "results"}
    assert data["model"] == "m2"
    assert [r["index"] for r in data["results"]] == [3, 1, 2]
    assert data["results"][0] == {
        "index": 3,
        "document": {"text": "red apple", "multi_modal": None},
        "relevance_score": 1.0,
    }
    scores = [r["relevance_score"] for r in data["results"]]
    assert scores == sorted(scores, reverse=True)
    assert data["usage"]["total_tokens"] == 2 * 4 + 2 + 3 + 1 + 2
    everything = await client.post(path, json={"query": "red", "documents": docs})
    assert len(everything.json()["results"]) == 4


@pytest.mark.parametrize(
    ("left", "right"),
    [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")],
)
async def test_score_shapes(client: httpx.AsyncClient, left: str, right: str) -> None:
    body = {left: "red apple", right: ["red", "apple red", "blue"]}
    resp = await client.post("/score", json=body)
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "list"
    assert isinstance(data["created"], int)
    assert data["model"] == "m1"
    assert data["data"] == [
        {"index": 0, "object": "score", "score": 0.5},
        {"index": 1, "object": "score", "score": 1.0},
        {"index": 2, "object": "score", "score": 0.0},
    ]
    assert data["usage"]["prompt_tokens"] == data["usage"]["total_tokens"] == 10


async def test_score_pairs_and_errors(client: httpx.AsyncClient) -> None:
    pairs = await client.post("/v1/score", json={"text_1": ["a", "b"], "text_2": ["a", "c"]})
    assert [d["score"] for d in pairs.json()["data"]] == [1.0, 0.0]
    bad = {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}
    assert_error(await client.post("/score", json=bad), 400)
    assert_error(await client.post("/score", json={"text_1": "a"}), 400)
    assert_error(
        await client.post("/score", json={"model": "no", "text_1": "a", "text_2": "b"}), 404
    )
    assert_error(await client.post("/rerank", json={"query": "a"}), 400)


async def test_pooling_and_classify(client: httpx.AsyncClient) -> None:
    pooled = (await client.post("/pooling", json={"input": ["a b", "c"]})).json()
    assert pooled["id"].startswith("pool-")
    assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
    assert len(pooled["data"][0]["data"]) == 8
    assert pooled["usage"]["prompt_tokens"] == 3
    emb = (await client.post("/v1/embeddings", json={"input": "a b"})).json()
    assert pooled["data"][0]["data"] == emb["data"][0]["embedding"]
    chat = await client.post("/pooling", json={"messages": [{"role": "user", "content": "x"}]})
    assert len(chat.json()["data"]) == 1
    classified = (await client.post("/classify", json={"input": ["good", "bad"]})).json()
    assert classified["id"].startswith("classify-")
    assert classified["object"] == "list"
    for i, item in enumerate(classified["data"]):
        assert item["index"] == i
        assert item["num_classes"] == 2
        assert item["label"] in ("negative", "positive")
        assert sum(item["probs"]) == pytest.approx(1.0)
    again = (await client.post("/classify", json={"input": ["good", "bad"]})).json()
    assert again["data"] == classified["data"]
    assert_error(await client.post("/classify", json={}), 400)
    assert_error(await client.post("/pooling", json={"input": "a", "model": "q"}), 404)


async def test_pooling_runner_faults_and_stats(client: httpx.AsyncClient) -> None:
    await set_faults(client, fail_status=429, fail_count=1)
    assert_error(await client.post("/rerank", json={"query": "a", "documents": ["a"]}), 429)
    assert (
        await client.post("/rerank", json={"query": "a", "documents": ["a"]})
    ).status_code == 200
    await client.post("/score", json={"text_1": "a", "text_2": "b"})
    data = await stats(client)
    assert data["failed"] == 1
    assert data["completed"] == 2
    assert [r["path"] for r in data["requests"]][-3:] == ["/rerank", "/rerank", "/score"]


# --- audio -------------------------------------------------------------------------------------


async def test_transcription_json_text_verbose(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    audio = b"\x01\x02\x03\x04" * 20000
    result = await sdk.audio.transcriptions.create(model="m1", file=("a.wav", audio))
    assert result.text == transcript(audio) == "fake transcript of a 80000 byte file 01020304"
    assert result.usage is not None
    assert result.usage.type == "duration"
    assert result.usage.seconds == 3
    text = await sdk.audio.transcriptions.create(
        model="m1", file=("a.wav", b"abc"), response_format="text", language="de", temperature=0.2
    )
    assert text == "fake transcript of a 3 byte file 616263"
    verbose = await sdk.audio.transcriptions.create(
        model="m2", file=("a.wav", b"abc"), response_format="verbose_json", language="de"
    )
    assert verbose.language == "de"
    assert verbose.text == transcript(b"abc")
    assert verbose.segments is not None
    assert verbose.segments[0].text == verbose.text
    translated = await client.post(
        "/v1/audio/translations", files={"file": ("a.wav", b"abc")}, data={"model": "m1"}
    )
    assert translated.json() == {"text": transcript(b"abc")}
    recorded = (await stats(client))["requests"][-1]
    assert recorded["body"]["file"] == {"filename": "a.wav", "size": 3}
    assert (await stats(client))["completed"] == 4


async def test_transcription_stream(client: httpx.AsyncClient) -> None:
    form = {"model": "m1", "stream": "true", "stream_include_usage": "true"}
    async with client.stream(
        "POST", "/v1/audio/transcriptions", files={"file": ("a.wav", b"abc")}, data=form
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = (await resp.aread()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"transcription.chunk"}
    assert all(c["id"].startswith("trsc-") for c in chunks)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks[:-1])
    assert text == transcript(b"abc")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(text.split())


async def test_transcription_sdk_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.audio.transcriptions.create(model="m1", file=("a.wav", b"abcd"), stream=True)
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == len(transcript(b"abcd").split())


async def test_transcription_errors(client: httpx.AsyncClient) -> None:
    url = "/v1/audio/transcriptions"
    assert_error(await client.post(url, data={"model": "m1"}), 400)
    assert_error(await client.post(url, files={"file": ("a", b"x")}, data={"model": "q"}), 404)
    bad_format = {"model": "m1", "response_format": "srt"}
    assert_error(await client.post(url, files={"file": ("a", b"x")}, data=bad_format), 400)
    options = {"stream_include_usage": "true"}
    assert_error(await client.post(url, files={"file": ("a", b"x")}, data=options), 400)
    await set_faults(client, fail_status=500, fail_count=1)
    assert_error(await client.post(url, files={"file": ("a", b"x")}), 500)


async def test_speech_wav_grows_with_input(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    short = await sdk.audio.speech.create(
        model="m1", input="hi", voice="alloy", response_format="wav"
    )
    long = await sdk.audio.speech.create(
        model="m1", input="hello there, a longer sentence", voice="alloy", response_format="wav"
    )
    assert short.response.headers["content-type"] == "audio/wav"
    for audio in (short.content, long.content):
        assert audio[:4] == b"RIFF"
        assert audio[8:16] == b"WAVEfmt "
        (data_len,) = struct.unpack("<I", audio[40:44])
        assert data_len == len(audio) - 44
    assert len(long.content) > len(short.content)
    writes = 0
    async with client.stream(
        "POST", "/v1/audio/speech", json={"input": "x" * 100, "voice": "alloy"}
    ) as resp:
        async for _ in resp.aiter_raw():
            writes += 1
    assert writes > 1
    assert_error(await client.post("/v1/audio/speech", json={"voice": "alloy"}), 400)
    bad = {"input": "a", "response_format": "mp3"}
    assert_error(await client.post("/v1/audio/speech", json=bad), 400)
    assert_error(await client.post("/v1/audio/speech", json={"input": "a", "model": "q"}), 404)


async def test_existing_routes_still_404_unknown(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/nothing")
    assert resp.status_code == 404
    assert resp.json() == {"detail": "Not Found"}


async def test_a_form_field_that_is_not_utf8_is_read_as_latin1_not_a_crash(
    client: httpx.AsyncClient,
) -> None:
    # Starlette (vLLM's server) decodes such a field as latin-1 (its `_user_safe_decode`);
    # the fake answered 500 with a UnicodeDecodeError.
    boundary = "b0undary"
    body = (
        (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="model"\r\n\r\nm1\r\n'
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="prompt"\r\n\r\n'
        ).encode()
        + b"caf\xe9 \xff\r\n"
        + (
            f"--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\nabc\r\n"
            f"--{boundary}--\r\n"
        ).encode()
    )
    answer = await client.post(
        "/v1/audio/transcriptions",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == transcript(b"abc")
    recorded = (await stats(client))["requests"][-1]
    assert recorded["body"]["prompt"] == "caf\xe9 \xff"
    assert recorded["body"]["file"] == {"filename": "a.wav", "size": 3}

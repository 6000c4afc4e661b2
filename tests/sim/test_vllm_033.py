"""The fake vLLM behaves as vLLM 0.33's source says (each test names the vLLM file)."""

from __future__ import annotations

import pytest

from tests.fakes.servers import fake_vllm

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
MEDIA_TYPE_ERROR = {
    "error": {
        "message": (
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        ),
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }
}


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "application/octet-stream"],
)
async def test_json_routes_refuse_other_content_types(content_type: str) -> None:
    """vllm/entrypoints/serve/utils/api_utils.py validate_json_request."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    async with fake_vllm(models=["m"]) as fake:
        for path in ("/v1/chat/completions", "/tokenize", "/v1/embeddings"):
            refused = await fake.client.post(
                path, content=body, headers={"content-type": content_type}
            )
            assert (refused.status_code, refused.json()) == (400, MEDIA_TYPE_ERROR), path
        taken = await fake.client.post(
            "/v1/chat/completions",
            content=body,
            headers={"content-type": "Application/JSON; charset=utf-8"},
        )
        assert taken.status_code == 200


async def test_a_body_without_content_type_is_refused_after_its_json_is_read() -> None:
    """FastAPI parses a body without content type as JSON before the dependency runs."""
    async with fake_vllm(models=["m"]) as fake:
        valid = await fake.client.post("/v1/completions", content=b'{"prompt": "hi"}')
        assert (valid.status_code, valid.json()) == (400, MEDIA_TYPE_ERROR)
        broken = await fake.client.post("/v1/completions", content=b"{nope")
        assert broken.status_code == 400
        assert "json_invalid" in broken.json()["error"]["message"]


async def test_max_tokens_beyond_the_context_is_clamped_not_refused() -> None:
    """vllm/entrypoints/serve/utils/api_utils.py get_max_tokens."""
    async with fake_vllm(models=["m"], max_model_len=10) as fake:
        resp = await fake.client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 9})
        assert resp.status_code == 200
        usage = resp.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3, 7)
        assert resp.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("/v1/completions", "max_tokens", {"prompt": "hi"}),
        ("/v1/chat/completions", "max_tokens", {"messages": CHAT["messages"]}),
        ("/v1/chat/completions", "max_completion_tokens", {"messages": CHAT["messages"]}),
        ("/v1/responses", "max_output_tokens", {"input": "hi"}),
    ],
)
async def test_max_tokens_above_max_model_len_is_a_400(
    path: str, field: str, body: dict[str, object]
) -> None:
    """vllm/renderers/params.py TokenizeParams.__post_init__."""
    async with fake_vllm(models=["m"], max_model_len=10) as fake:
        resp = await fake.client.post(path, json={**body, field: 11})
        assert resp.status_code == 400
        assert resp.json()["error"] == {
            "message": f"{field}=11 cannot be greater than max_model_len=10. Please request "
            f"fewer output tokens. (parameter={field}, value=11)",
            "type": "BadRequestError",
            "param": field,
            "code": 400,
        }
        models = (await fake.client.get("/v1/models")).json()
        assert models["data"][0]["max_model_len"] == 10


async def test_api_key_guards_v1_and_v2_with_bearer_only() -> None:
    """vllm/entrypoints/serve/middleware/authenticate.py."""
    async with fake_vllm(models=["m"], api_key=["sekret"]) as fake:
        client = fake.client
        for headers in ({}, {"authorization": "Basic sekret"}, {"authorization": "Bearer no"}):
            denied = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert (denied.status_code, denied.content) == (401, b'{"error":"Unauthorized"}')
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.post("/v2/rerank", json={})).status_code == 401
        ok = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": "bearer sekret"}
        )
        assert ok.status_code == 200
        for path in ("/health", "/metrics", "/version"):
            assert (await client.get(path)).status_code == 200, path
        tokenized = await client.post("/tokenize", json={"prompt": "hi"})
        assert tokenized.status_code == 200


async def test_sleep_level_0_is_sleeping_and_wake_bodies() -> None:
    """vllm/entrypoints/serve/dev/sleep/api_router.py; vllm/v1/engine/core.py."""
    async with fake_vllm(models=["m"], dev_mode=True) as fake:
        client = fake.client
        slept = await client.post("/sleep", params={"level": 0})
        assert slept.json() == {"status": "sleeping", "level": 0}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        woken = await client.post("/wake_up", params={"tags": "scheduling"})
        assert woken.json() == {"status": "awake", "tags": ["scheduling"]}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        await client.post("/sleep", params={"level": 1})
        partial = await client.post(
            "/wake_up", params=[("tags", "weights"), ("tags", "scheduling")]
        )
        assert partial.json() == {"status": "sleeping", "tags": ["weights", "scheduling"]}
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        rest = await client.post("/wake_up", params={"tags": "kv_cache"})
        assert rest.json() == {"status": "awake", "tags": ["kv_cache"]}
        bad = await client.post("/sleep", params={"level": 3})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "query.level"
        assert bad.json()["error"]["type"] == "Bad Request"
        missing = await client.post("/collective_rpc", json={})
        assert missing.json()["error"] == {
            "message": "Missing 'method' in request body",
            "type": "Bad Request",
            "param": None,
            "code": 400,
        }


async def test_unknown_model_names_the_valid_aliases() -> None:
    """vllm/entrypoints/serve/engine/serving.py _check_model."""
    async with fake_vllm(models=["a", "b"]) as fake:
        resp = await fake.client.post("/v1/chat/completions", json={**CHAT, "model": "x"})
        assert resp.status_code == 404
        assert resp.json()["error"]["message"] == (
            "The model `x` does not exist. Valid aliases: a, b."
        )


async def test_runtime_lora_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm/entrypoints/serve/lora/api_router.py, vllm/entrypoints/openai/models/serving.py."""
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    async with fake_vllm(models=["m"]) as fake:
        absent = await fake.client.post("/v1/load_lora_adapter", json={})
        assert absent.status_code == 404
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    async with fake_vllm(models=["m"]) as fake:
        client = fake.client
        load = {"lora_name": "sql", "lora_path": "/adapters/sql"}
        loaded = await client.post("/v1/load_lora_adapter", json=load)
        assert (loaded.status_code, loaded.text) == (
            200,
            "Success: LoRA adapter 'sql' added successfully.",
        )
        again = await client.post("/v1/load_lora_adapter", json=load)
        assert again.status_code == 400
        assert again.json()["error"]["type"] == "InvalidUserInput"
        clash = await client.post("/v1/load_lora_adapter", json={**load, "lora_name": "m"})
        assert clash.json()["error"]["message"] == (
            "The lora adapter 'm' conflicts with a served base model."
        )
        cards = (await client.get("/v1/models")).json()["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
            ("m", None, "m"),
            ("sql", "m", "/adapters/sql"),
        ]
        answer = await client.post("/v1/chat/completions", json={**CHAT, "model": "sql"})
        assert (answer.status_code, answer.json()["model"]) == (200, "sql")
        unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert unloaded.text == "Success: LoRA adapter 'sql' removed successfully."
        gone = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert gone.status_code == 404
        assert gone.json()["error"]["message"] == "The lora adapter 'sql' cannot be found."
        refused = await client.post("/v1/chat/completions", json={**CHAT, "model": "sql"})
        assert refused.status_code == 404
        form = await client.post(
            "/v1/load_lora_adapter",
            content=b"lora_name=x",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert (form.status_code, form.json()) == (400, MEDIA_TYPE_ERROR)


@pytest.mark.parametrize(("asked", "written", "finish"), [(100, 5, "stop"), (3, 3, "length")])
async def test_an_answer_ends_at_its_end_of_sequence(asked: int, written: int, finish: str) -> None:
    """`--eos-after`: a model ends its answer before max_tokens (finish_reason stop), as a
    real one does; Claude Code's 32,000 asked is then not 32,000 written."""
    async with fake_vllm(models=["m"], eos_after=5) as fake:
        chat = await fake.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": asked})
        assert chat.json()["usage"]["completion_tokens"] == written
        assert chat.json()["choices"][0]["finish_reason"] == finish
        body = {"model": "m", "max_tokens": asked, "messages": [{"role": "user", "content": "hi"}]}
        message = (await fake.client.post("/v1/messages", json=body)).json()
        assert message["usage"]["output_tokens"] == written
        assert message["stop_reason"] == {"stop": "end_turn", "length": "max_tokens"}[finish]

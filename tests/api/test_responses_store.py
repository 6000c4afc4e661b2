"""Stored responses through the gateway, against vLLM 0.33's rules: a follow-up
(`previous_response_id`, GET, cancel) reaches the replica that created the id; a backend
that does not keep responses (no VLLM_ENABLE_RESPONSES_API_STORE=1) gets its 404
explained; DELETE and input_items, which vLLM does not offer, are answered by the gateway
for a local backend and relayed to a cloud provider (OpenAI has them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.provider import cloud_settings, fake_openai_provider
from tests.fakes.servers import FakeServer, Gateway, fake_vllm, gateway, gateway_settings

CLOUD_KEY = "sk-test-cloud-0123456789"


async def paths(server: FakeServer) -> list[tuple[str, str, Any]]:
    return [(r["method"], r["path"], r["body"]) for r in (await server.stats())["requests"]]


async def creates(server: FakeServer) -> int:
    return sum(1 for m, p, _ in await paths(server) if (m, p) == ("POST", "/v1/responses"))


async def post_on(
    gw: Gateway, a: FakeServer, b: FakeServer, body: dict[str, Any]
) -> tuple[Any, str]:
    """POST /v1/responses through the gateway: its answer, and the replica that took it
    (from the fakes' request logs)."""
    before = await creates(a)
    answer = await gw.client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json(), "qwen-a" if await creates(a) > before else "qwen-b"


@asynccontextmanager
async def pool(**vllm: Any) -> AsyncIterator[tuple[Gateway, FakeServer, FakeServer]]:
    """`qwen-a` and `qwen-b`, replicas of `qwen-pool` serving `qwen`."""
    async with (
        fake_vllm(models=["qwen"], max_tokens=2, **vllm) as a,
        fake_vllm(models=["qwen"], max_tokens=2, **vllm) as b,
    ):
        member = {"models": ["qwen"], "replica_of": "qwen-pool"}
        settings = gateway_settings(
            {"qwen-a": {"url": a.url, **member}, "qwen-b": {"url": b.url, **member}}
        )
        async with gateway(settings) as gw:
            yield gw, a, b


async def test_follow_ups_stay_on_the_replica_that_created_the_id() -> None:
    async with pool(responses_store=True) as (gw, a, b):
        made: dict[str, str] = {}  # response id -> the replica that created it
        for i in range(12):  # the pick alternates: each replica creates some
            created, creator = await post_on(gw, a, b, {"model": "qwen", "input": f"hi {i}"})
            made[created["id"]] = creator
        assert set(made.values()) == {"qwen-a", "qwen-b"}
        # every id of qwen-a's first, then qwen-b's: not the order the pick alternates in
        for rid, creator in sorted(made.items(), key=lambda item: item[1]):
            body = {"model": "qwen", "input": "and then?", "previous_response_id": rid}
            follow, took = await post_on(gw, a, b, body)
            assert took == creator
            # the follow-up's own id is remembered where it was made: a chain of them
            got = await gw.client.get(f"/v1/responses/{follow['id']}")
            assert got.status_code == 200, got.text
            got = await gw.client.get(f"/v1/responses/{rid}")
            assert got.status_code == 200, got.text
        for server, name in ((a, "qwen-a"), (b, "qwen-b")):
            seen = await paths(server)
            own = {rid for rid, creator in made.items() if creator == name}
            continued = {
                body["previous_response_id"]
                for method, path, body in seen
                if path == "/v1/responses" and body.get("previous_response_id")
            }
            assert continued == own
            fetched = {
                path.rsplit("/", 1)[1] for m, path, _ in seen if m == "GET" and "resp_" in path
            }
            assert own <= fetched
            assert not fetched & (set(made) - own)


async def test_a_backend_without_the_store_gets_its_404_explained() -> None:
    async with fake_vllm(models=["m"], max_tokens=2, task="generate") as fake:
        settings = gateway_settings({"b": {"url": fake.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            created = await gw.client.post("/v1/responses", json={"model": "m", "input": "hi"})
            assert created.status_code == 200
            rid = created.json()["id"]
            got = await gw.client.get(f"/v1/responses/{rid}")
            assert got.status_code == 404
            error = got.json()["error"]
            assert error["code"] == "response_not_found"
            assert error["param"] == "response_id"
            assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in error["message"]
            assert f"Response with id '{rid}' not found." in error["message"]
            # the id is forgotten: the next GET is the gateway's own 404, not relayed
            before = len(await paths(fake))
            again = await gw.client.get(f"/v1/responses/{rid}")
            assert again.json()["error"]["code"] == "response_not_found"
            assert len(await paths(fake)) == before
            for previous in (rid, "resp_made_elsewhere"):  # known or not to the gateway
                follow = await gw.client.post(
                    "/v1/responses",
                    json={"model": "m", "input": "more", "previous_response_id": previous},
                )
                assert follow.status_code == 404
                error = follow.json()["error"]
                assert error["param"] == "previous_response_id"
                assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in error["message"]


async def test_delete_and_input_items_are_answered_for_a_vllm_backend() -> None:
    async with fake_vllm(models=["m"], max_tokens=2, responses_store=True) as fake:
        settings = gateway_settings({"b": {"url": fake.url, "models": ["m"]}})
        async with gateway(settings) as gw:
            rid = (await gw.client.post("/v1/responses", json={"model": "m", "input": "x"})).json()[
                "id"
            ]
            before = len(await paths(fake))
            deleted = await gw.client.delete(f"/v1/responses/{rid}")
            assert deleted.status_code == 405
            assert deleted.headers["allow"] == "GET"
            error = deleted.json()["error"]
            assert error["code"] == "method_not_allowed"
            assert "vLLM does not offer deleting" in error["message"]
            items = await gw.client.get(f"/v1/responses/{rid}/input_items")
            assert items.status_code == 404
            assert items.json()["error"]["code"] == "endpoint_not_served"
            assert "input_items" in items.json()["error"]["message"]
            assert len(await paths(fake)) == before  # neither was relayed
            assert (await gw.client.get(f"/v1/responses/{rid}")).status_code == 200


async def test_a_cloud_providers_delete_and_input_items_are_relayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUD_KEY", CLOUD_KEY)
    async with (
        fake_vllm(models=["local"], fail_status=503) as local,
        fake_openai_provider(CLOUD_KEY, model="cloud-model", max_tokens=2) as cloud,
    ):
        settings = cloud_settings(
            {"local": {"url": local.url, "models": ["local"], "aliases": ["chat"]}},
            {
                "cloud": {
                    "kind": "openai",
                    "base_url": cloud.base_url,
                    "model": "cloud-model",
                    "api_key_env": "CLOUD_KEY",
                }
            },
            {"chat": {"entries": ["local", "cloud"]}},
            state_dir=tmp_path,
        )
        async with gateway(settings) as gw:
            made = await gw.client.post("/v1/responses", json={"model": "chat", "input": "x"})
            assert made.status_code == 200, made.text
            assert made.headers["x-microscheduler-route"] == "cloud"
            rid = made.json()["id"]
            tried = len(await paths(local))
            follow = await gw.client.post(
                "/v1/responses",
                json={"model": "chat", "input": "y", "previous_response_id": rid},
            )
            assert follow.status_code == 200, follow.text  # pinned to the provider
            sent = (await cloud.stats())["requests"][-1]
            assert sent["body"]["previous_response_id"] == rid
            assert len(await paths(local)) == tried  # not walked through the chain
            await cloud.set_faults(fail_status=500, fail_count=1)
            failed = await gw.client.delete(f"/v1/responses/{rid}")
            assert failed.status_code == 500
            deleted = await gw.client.delete(f"/v1/responses/{rid}")
            assert deleted.status_code == 200  # still routed: the first delete did not happen
            assert deleted.json()["deleted"] is True
            gone = await gw.client.delete(f"/v1/responses/{rid}")
            assert gone.json()["error"]["code"] == "response_not_found"


@asynccontextmanager
async def two_keys(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Gateway, FakeServer]]:
    """A gateway with client keys `a` (sk-a-...) and `b` (sk-b-...) before one fake vLLM
    that keeps responses."""
    monkeypatch.setenv("A_KEY", "sk-a-0123456789")
    monkeypatch.setenv("B_KEY", "sk-b-0123456789")
    keys = {"a": {"key_env": "A_KEY"}, "b": {"key_env": "B_KEY"}}
    async with fake_vllm(models=["m"], max_tokens=2, responses_store=True) as fake:
        settings = gateway_settings(
            {"b": {"url": fake.url, "models": ["m"]}}, client_keys={"keys": keys}
        )
        async with gateway(settings) as gw:
            yield gw, fake


async def test_another_keys_previous_response_id_is_not_relayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with two_keys(monkeypatch) as (gw, fake):
        made = await gw.client.post(
            "/v1/responses",
            json={"model": "m", "input": "secret"},
            headers={"authorization": "Bearer sk-a-0123456789"},
        )
        rid = made.json()["id"]
        before = len(await paths(fake))
        other = await gw.client.post(
            "/v1/responses",
            json={"model": "m", "input": "tell me", "previous_response_id": rid},
            headers={"authorization": "Bearer sk-b-0123456789"},
        )
        assert other.status_code == 404
        assert other.json()["error"]["code"] == "response_not_found"
        assert len(await paths(fake)) == before


async def test_a_client_cannot_choose_a_stored_response_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM names a response after the body's `request_id`, and takes a request's id from
    # `x-request-id`: key b naming key a's response id in either must not take it over.
    async with two_keys(monkeypatch) as (gw, fake):
        a_auth = {"authorization": "Bearer sk-a-0123456789"}
        made = await gw.client.post(
            "/v1/responses", json={"model": "m", "input": "secret"}, headers=a_auth
        )
        rid = made.json()["id"]
        taken = await gw.client.post(
            "/v1/responses",
            json={"model": "m", "input": "mine now", "request_id": rid},
            headers={"authorization": "Bearer sk-b-0123456789", "x-request-id": rid},
        )
        assert taken.status_code == 200, taken.text
        assert taken.json()["id"] != rid
        sent = (await fake.stats())["requests"][-1]
        assert "request_id" not in sent["body"]
        assert "x-request-id" not in sent["headers"]
        # a's response is still a's, where it was
        got = await gw.client.get(f"/v1/responses/{rid}", headers=a_auth)
        assert got.status_code == 200, got.text
        assert got.json()["output"] == made.json()["output"]

"""Stored responses across a replica group, end to end: two fake vLLM processes (with
VLLM_ENABLE_RESPONSES_API_STORE=1) behind a gateway process; every follow-up of an id
(`previous_response_id`, GET) reaches the replica that created it, by their request logs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.processes import fake_vllm_process, gateway_process

pytestmark = pytest.mark.e2e
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


def log_of(url: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = httpx.get(url + "/_fake/stats", timeout=5).json()["requests"]
    return requests


def creates(url: str) -> int:
    return sum(1 for r in log_of(url) if (r["method"], r["path"]) == ("POST", "/v1/responses"))


def test_follow_ups_reach_the_replica_that_created_the_id() -> None:
    flags = ("--task", "generate", "--max-tokens", "2")
    with (
        fake_vllm_process("qwen", *flags, env=STORE) as a,
        fake_vllm_process("qwen", *flags, env=STORE) as b,
    ):
        member = {"models": ["qwen"], "replica_of": "qwen-pool"}
        models = {"backends": {"qwen-a": {"url": a, **member}, "qwen-b": {"url": b, **member}}}
        with (
            gateway_process(models, wait_ready=True) as gw,
            httpx.Client(base_url=gw.url, timeout=10) as client,
        ):

            def post(body: dict[str, Any]) -> tuple[str, str]:
                before = creates(a)
                answer = client.post("/v1/responses", json=body)
                assert answer.status_code == 200, answer.text
                return answer.json()["id"], a if creates(a) > before else b

            made = dict(post({"model": "qwen", "input": f"hello {i}"}) for i in range(12))
            assert set(made.values()) == {a, b}  # the creates alternate between them
            # a's ids first, then b's: an order the pick's rotation does not follow
            for rid, creator in sorted(made.items(), key=lambda item: item[1]):
                body = {"model": "qwen", "input": "go on", "previous_response_id": rid}
                _, took = post(body)
                assert took == creator
                assert client.get(f"/v1/responses/{rid}").status_code == 200
        for url in (a, b):
            own = {rid for rid, creator in made.items() if creator == url}
            log = log_of(url)
            continued = {
                r["body"]["previous_response_id"]
                for r in log
                if r["path"] == "/v1/responses" and (r["body"] or {}).get("previous_response_id")
            }
            fetched = {r["path"].rsplit("/", 1)[1] for r in log if r["method"] == "GET"
                       and r["path"].startswith("/v1/responses/")}  # fmt: skip
            assert continued == own
            assert fetched == own

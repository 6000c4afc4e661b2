"""Schemathesis over every operation of `GET /openapi.json` (positive and negative cases),
against the gateway in process with a fake vLLM behind it. Invariants: `tests.fakes.envelopes`.

Short by default; `MICROSCHEDULER_FUZZ_EXAMPLES=20000` for a long run. Left out: the status
and model event streams (they never end) and the admin POSTs that change what the gateway
may serve (VRAM yield/restore, zone acquire, profile activation, a config reload, which
would load the config directory's files in place of the test's): the run would then test
another gateway, or one with nothing left to route to. Start/stop/sleep and a model's
load/unload stay in: the backends are external.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.main import create_app
from app.settings import Settings
from tests.fakes.envelopes import problems
from tests.fakes.servers import gateway_settings
from tests.fakes.threaded import ThreadedGateway

EXAMPLES = int(os.environ.get("MICROSCHEDULER_FUZZ_EXAMPLES", "300"))
ENDPOINTS = ["chat", "completions", "embeddings", "responses", "tokenize", "detokenize",
             "rerank", "score", "classify", "pooling", "transcriptions", "translations",
             "speech", "images"]  # fmt: skip
STATEFUL = r"^/(vram/(yield|restore|zones/[^/]+/acquire)|profiles/[^/]+/activate|config/reload)$"


def fuzz_settings(url: str) -> Settings:
    return gateway_settings(
        {
            "omni": {"url": url, "models": ["served-model"], "aliases": ["omni"],
                     "endpoints": ENDPOINTS},
            "chatty": {"url": url, "models": ["chat-only"]},
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def live() -> Iterator[ThreadedGateway]:
    with ThreadedGateway(fuzz_settings, models=["served-model", "chat-only"], max_tokens=4) as gw:
        yield gw


SCHEMA = (
    schemathesis.openapi.from_dict(create_app(fuzz_settings("http://127.0.0.1:9")).openapi())
    .exclude(path="/status/stream")
    .exclude(path="/models/sse")
    .exclude(method="POST", path_regex=STATEFUL)
)
CASES = st.sampled_from(list(schemathesis.GenerationMode)).flatmap(
    lambda mode: SCHEMA.as_strategy(generation_mode=mode)
)
_SENT = ("method", "url", "headers", "params", "cookies", "json", "data", "files")


def _send(live: ThreadedGateway, case: schemathesis.Case[Any]) -> tuple[str, Any]:
    kwargs = case.as_transport_kwargs(base_url="http://localhost")
    prepared = requests.Request(**{k: v for k, v in kwargs.items() if k in _SENT}).prepare()
    body = prepared.body
    content = body.encode() if isinstance(body, str) else body
    assert prepared.method is not None
    assert prepared.url is not None
    response = live.request(
        prepared.method, prepared.url, headers=dict(prepared.headers), content=content
    )
    return case.operation.path, response


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(case=CASES)
def test_every_operation_answers_in_its_envelope(
    live: ThreadedGateway, case: schemathesis.Case[Any]
) -> None:
    path, response = _send(live, case)
    found = problems(path, response)
    assert not found, f"{case.as_curl_command()}\n -> {found}"

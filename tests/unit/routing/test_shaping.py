"""Request shaping (`app.routing.shaping`): what of a client's request its upstream gets.
Pure functions, no loop."""

from __future__ import annotations

from typing import Any

import pytest

from app.routing.shaping import upstream_headers, with_stream_usage
from app.settings.endpoints import Api

ASKED: dict[str, Any] = {"include_usage": True}


@pytest.mark.parametrize("api", [Api.CHAT, Api.COMPLETIONS])
def test_a_key_counting_tokens_asks_a_stream_for_its_usage(api: Api) -> None:
    payload = {"model": "m", "stream": True, "stream_options": {"continuous_usage_stats": False}}
    shaped, added = with_stream_usage(payload, stream=True, api=api, counts_tokens=True)
    assert added is True
    assert shaped["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert payload["stream_options"] == {"continuous_usage_stats": False}  # not changed


@pytest.mark.parametrize(
    ("payload", "stream", "api", "counts_tokens"),
    [
        ({"model": "m", "stream": True}, True, Api.CHAT, False),  # no token limit
        ({"model": "m"}, False, Api.CHAT, True),  # no stream: the answer has its usage
        ({"model": "m", "stream": True}, True, Api.RESPONSES, True),  # usage always sent
        ({"model": "m", "stream": True, "stream_options": ASKED}, True, Api.CHAT, True),
    ],
)
def test_otherwise_the_payload_is_relayed_as_the_client_sent_it(
    payload: dict[str, Any], stream: bool, api: Api, counts_tokens: bool
) -> None:
    shaped, added = with_stream_usage(payload, stream=stream, api=api, counts_tokens=counts_tokens)
    assert (shaped, added) == (payload, False)
    assert shaped is payload


def test_upstream_headers_leave_out_hop_by_hop_credentials_and_the_request_id() -> None:
    sent = [
        (b"host", b"gw"),
        (b"authorization", b"Bearer sk-client"),
        (b"x-api-key", b"sk-ant"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"content-length", b"12"),
        (b"x-request-id", b"abc"),
        (b"cookie", b"s=1"),
        (b"Content-Type", b"application/json"),
        (b"openai-beta", b"assistants=v2"),
    ]
    assert upstream_headers(sent) == {
        "content-type": "application/json",
        "openai-beta": "assistants=v2",
    }

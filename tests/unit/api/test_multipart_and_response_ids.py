"""Routing an upload by its form's `model`, and remembering who created a stored response."""

from __future__ import annotations

import httpx
import pytest

from app.api.protocol import PROXIED, parse_request
from app.errors import InvalidRequest
from app.routing.registry import Route
from app.routing.responses import ResponseIds, created_response_id
from app.routing.shaping import upstream_body
from app.upstreams.multipart import boundary_of, form_fields, part_names, replace_field

TRANSCRIPTIONS = next(e for e in PROXIED if e.path == "/v1/audio/transcriptions")
AUDIO = bytes(range(256)) * 64  # binary, with CR LF and "--" inside


def encoded_form(fields: dict[str, str], *, file_first: bool) -> tuple[bytes, str]:
    """A body as httpx (what the openai SDK uses) encodes it."""
    files = {"file": ("speech.wav", AUDIO, "audio/wav")}
    request = httpx.Request("POST", "http://x/", data=fields, files=files)
    body = request.read()
    content_type = request.headers["content-type"]
    if file_first:  # the same parts with the file before the fields
        boundary = boundary_of(content_type)
        assert boundary is not None
        parts = body.split(b"--" + boundary)
        file_part = next(p for p in parts if b'filename="speech.wav"' in p)
        others = [p for p in parts[1:-1] if p is not file_part]
        body = b"--" + boundary + (b"--" + boundary).join([file_part, *others, parts[-1]])
    return body, content_type


@pytest.mark.parametrize("file_first", [False, True])
def test_the_model_is_found_wherever_it_sits_and_replaced_without_touching_the_file(
    file_first: bool,
) -> None:
    body, content_type = encoded_form(
        {"model": "whisper", "stream": "true", "language": "en"}, file_first=file_first
    )
    boundary = boundary_of(content_type)
    assert boundary is not None
    assert form_fields(body, boundary, frozenset({"model", "stream"})) == {
        "model": "whisper",
        "stream": "true",
    }
    assert part_names(body, boundary) == {"model", "stream", "language", "file"}
    replaced = replace_field(body, boundary, "model", "openai/whisper-large-v3")
    assert AUDIO in replaced
    assert len(replaced) == len(body) + len("openai/whisper-large-v3") - len("whisper")
    assert form_fields(replaced, boundary, frozenset({"model"})) == {
        "model": "openai/whisper-large-v3"
    }

    parsed = parse_request(body, TRANSCRIPTIONS, content_type)
    assert (parsed.model, parsed.stream) == ("whisper", True)
    route = Route(name="whisper", backend="asr", upstream_model="openai/whisper-large-v3")
    assert upstream_body(parsed, route) == replaced


def test_a_file_named_like_a_field_is_not_the_field() -> None:
    request = httpx.Request(
        "POST",
        "http://x/",
        data={"model": "whisper"},
        files={"model": ("model", b"not a name", "text/plain")},
    )
    body = request.read()
    boundary = boundary_of(request.headers["content-type"])
    assert boundary is not None
    assert form_fields(body, boundary, frozenset({"model"})) == {"model": "whisper"}


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b'{"model": "whisper"}', "application/json", "takes multipart/form-data"),
        (b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--\r\n",
         "multipart/form-data; boundary=b", "You must provide a model parameter."),
        (b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nw\r\n--b--\r\n",
         "multipart/form-data; boundary=b", "Missing required parameter: 'file'."),
    ],
)  # fmt: skip
def test_a_form_without_what_routing_needs_is_a_clear_400(
    body: bytes, content_type: str, message: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(body, TRANSCRIPTIONS, content_type)
    assert message in info.value.message


def test_quoted_boundaries_and_other_types() -> None:
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
    assert boundary_of("Multipart/Form-Data; charset=utf-8; boundary=xyz") == b"xyz"
    assert boundary_of("application/json") is None
    assert boundary_of("multipart/form-data") is None


def test_the_created_id_is_read_from_an_object_or_the_first_event() -> None:
    assert created_response_id(b'{"id":"resp_abc123","object":"response"}') == "resp_abc123"
    event = (
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
        b'"response":{"id":"resp_9f","object":"response"}}\n\n'
    )
    assert created_response_id(event) == "resp_9f"
    assert created_response_id(b'{"id":"chatcmpl-1"}') is None


def test_ids_expire_and_the_oldest_go_first() -> None:
    now = [0.0]
    ids = ResponseIds(ttl_s=10, max_ids=2, clock=lambda: now[0])
    route = Route(name="m", backend="b", upstream_model="m")
    ids.remember("resp_1", "b", route)
    ids.remember("resp_2", "c", route)
    ids.remember("resp_3", "b", route)
    assert ids.lookup("resp_1") is None  # over max_ids
    stored = ids.lookup("resp_2")
    assert stored is not None
    assert stored.entry == "c"
    now[0] = 10.0
    assert ids.lookup("resp_3") is None
    assert len(ids) == 0

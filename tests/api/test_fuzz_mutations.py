"""A mutation fuzzer: valid bodies of the routed endpoints, broken in the ways clients
break them (flipped bytes, truncation, swapped types, huge and non-finite numbers, deep
nesting, lone surrogates written as JSON escapes, the wrong content-type), sent to the
gateway in process with a fake vLLM behind it. Invariants: `tests.fakes.envelopes`.

Short by default; `MICROSCHEDULER_FUZZ_EXAMPLES=20000` for a long run.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_fuzz_schema import fuzz_settings
from tests.fakes.envelopes import problems
from tests.fakes.threaded import ThreadedGateway

EXAMPLES = int(os.environ.get("MICROSCHEDULER_FUZZ_EXAMPLES", "300"))
MAX_DEPTH = 5000

_USER = [{"role": "user", "content": "hi"}]
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "omni", "messages": _USER, "max_tokens": 4},
    "/v1/completions": {"model": "omni", "prompt": "hi", "max_tokens": 4},
    "/v1/embeddings": {"model": "omni", "input": "hi"},
    "/v1/responses": {"model": "omni", "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"model": "omni", "max_tokens": 4, "messages": _USER},
    "/v1/messages/count_tokens": {"model": "omni", "messages": _USER},
    "/v1/rerank": {"model": "omni", "query": "q", "documents": ["a", "b"]},
    "/tokenize": {"model": "omni", "prompt": "hi"},
}
UPLOAD = "/v1/audio/transcriptions"
BOUNDARY = "fuzzboundary"

ODD_TEXT = st.sampled_from(
    ["\ud800", "\udcff", "a\udfffb", "\x00", "\u202e", "\ufeff", "\U0010ffff", "", " ",
     "x" * 5000, "omni\x00", "omni ", "OMNI", "chat-only", "../../etc", "%s%n", "\\u"]
)  # fmt: skip
ODD_NUMBERS = st.sampled_from(
    [10**400, -(10**400), float("nan"), float("inf"), float("-inf"), -0.0, 2**63, 1e308, 0]
)
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), ODD_NUMBERS, ODD_TEXT,
    st.text(max_size=20), st.just([]), st.just({}),
)  # fmt: skip


def deep(depth: int, kind: str) -> str:
    """`depth` nested arrays or objects, as JSON text (too deep to build as Python)."""
    return ("[" * depth + "]" * depth) if kind == "[" else ('{"a":' * depth + "1" + "}" * depth)


DEEP_MARK = "\x00DEEP\x00"
LONG_MARK = "\x00LONG\x00"


@st.composite
def mutated_value(draw: st.DrawFn, value: Any) -> Any:
    """`value` with one change somewhere inside it."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        action = draw(st.sampled_from(["recurse", "delete", "add"]))
        copy = dict(value)
        if action == "recurse":
            copy[key] = draw(mutated_value(value[key]))
        elif action == "delete":
            del copy[key]
        else:
            copy[draw(st.one_of(ODD_TEXT, st.sampled_from(["stream", "stream_options", "n"])))] = (
                draw(LEAVES)
            )
        return copy
    if isinstance(value, list) and value and draw(st.booleans()):
        index = draw(st.integers(0, len(value) - 1))
        items = list(value)
        items[index] = draw(mutated_value(value[index]))
        return items
    replacement = draw(
        st.one_of(
            LEAVES,
            st.just(DEEP_MARK),
            st.just(LONG_MARK),
            st.lists(LEAVES, max_size=3),
            st.dictionaries(ODD_TEXT, LEAVES, max_size=2),
            st.just([value]),
            st.just({"value": value}),
        )
    )
    return replacement


@st.composite
def body_bytes(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    value = draw(mutated_value(valid)) if draw(st.integers(0, 9)) else valid
    ascii_only = draw(st.booleans())
    try:
        text = json.dumps(value, ensure_ascii=ascii_only)
    except ValueError:
        text = json.dumps(value)
    if DEEP_MARK in text or '"\\u0000DEEP\\u0000"' in text:
        nested = deep(draw(st.integers(1, MAX_DEPTH)), draw(st.sampled_from(["[", "{"])))
        text = text.replace(json.dumps(DEEP_MARK), nested).replace(
            json.dumps(DEEP_MARK, ensure_ascii=False), nested
        )
    for mark in (json.dumps(LONG_MARK), json.dumps(LONG_MARK, ensure_ascii=False)):
        # An integer or a number of thousands of digits (Python parses at most 4300).
        digits = "1" + "0" * draw(st.integers(1, 10_000))
        text = text.replace(mark, draw(st.sampled_from([digits, "-" + digits, digits + ".5"])))
    raw = text.encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert"]))
    if damage == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif damage == "flip" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif damage == "insert":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    return raw


CONTENT_TYPES = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", "",
     "application/x-www-form-urlencoded", f"multipart/form-data; boundary={BOUNDARY}",
     "multipart/form-data", "multipart/form-data; boundary=", "application/json; charset=latin-1",
     "\u00e9/\u00e9"]
)  # fmt: skip


def form(fields: list[tuple[str, str | None, bytes]], boundary: str = BOUNDARY) -> bytes:
    """A multipart body of (name, filename, content) parts."""
    out = b""
    for name, filename, content in fields:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename is not None else ""
        )
        out += _utf8(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n")
        out += content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


@st.composite
def upload(draw: st.DrawFn) -> tuple[bytes, str]:
    # Relayed text fields hold UTF-8 (what cannot be is escaped): the fake vLLM answers a
    # 500 (and leaks temporary files) for a text field it cannot decode. Only the one
    # `model` field may be any bytes: the gateway reads it, and no model has such a name.
    names = st.one_of(st.sampled_from(["file", "stream", "language"]), ODD_TEXT)
    model = draw(st.one_of(st.just(b"omni"), st.binary(max_size=8), ODD_TEXT.map(_utf8)))
    parts: list[tuple[str, str | None, bytes]] = [
        ("model", None, model),
        ("file", "a.wav", b"RIFF"),
    ]
    for _ in range(draw(st.integers(0, 3))):
        filename = draw(st.one_of(st.none(), ODD_TEXT))
        content = draw(st.binary(max_size=20) if filename is not None else ODD_TEXT.map(_utf8))
        parts.append((draw(names), filename, content))
    if draw(st.booleans()):
        parts = draw(st.permutations(parts))[: draw(st.integers(0, len(parts)))]
    raw = form(parts)
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    ctype = draw(st.one_of(st.just(f"multipart/form-data; boundary={BOUNDARY}"), CONTENT_TYPES))
    return raw, ctype


@st.composite
def requests_to_send(draw: st.DrawFn) -> tuple[str, bytes, str]:
    path = draw(st.sampled_from([*VALID, UPLOAD]))
    if path == UPLOAD:
        raw, ctype = draw(upload())
        return path, raw, ctype
    ctype = draw(st.one_of(st.just("application/json"), CONTENT_TYPES))
    valid = VALID[path]
    if path != "/v1/messages/count_tokens" and draw(st.booleans()):
        valid = {**valid, "stream": True}  # the streaming relay (and its translation)
    return path, draw(body_bytes(valid)), ctype


# The fake vLLM leaks the temporary files of a multipart body it fails to parse (in
# reference cycles, so whenever the collector runs); the gateway reads no upload to a file.
pytestmark = pytest.mark.filterwarnings("ignore:Unclosed file <tempfile:ResourceWarning")


@pytest.fixture(scope="module")
def live() -> Iterator[ThreadedGateway]:
    with ThreadedGateway(fuzz_settings, models=["served-model", "chat-only"], max_tokens=4) as gw:
        yield gw
    gc.collect()  # the fake's leaks, while this module's filter holds


@settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
@given(request=requests_to_send())
def test_broken_bodies_get_an_error_in_the_route_envelope(
    live: ThreadedGateway, request: tuple[str, bytes, str]
) -> None:
    path, raw, ctype = request
    headers = {b"content-type": ctype.encode("latin-1")} if ctype else {}
    response = live.request("POST", path, headers=headers, content=raw)
    found = problems(path, response)
    assert not found, f"POST {path} content-type={ctype!r} body={raw[:400]!r}\n -> {found}"

"""An upstream response's headers are relayed as they came (bytes, names lower-cased),
without the hop-by-hop ones, those its `Connection` names, and `server`/`date`; the
request's headers keep a JSON label as sent. A real aiohttp server on 127.0.0.1."""

from __future__ import annotations

from aiohttp import web

from app.settings import TimeoutsConfig
from app.upstreams.http import HttpUpstream, upstream_content_type
from tests.fakes.servers import serve_app


async def test_response_headers_are_relayed_as_bytes_without_hop_by_hop_ones() -> None:
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        response = web.Response(body=b"{}", content_type="application/json")
        response.headers["Connection"] = "keep-alive, X-Hop-Named"
        response.headers["X-Hop-Named"] = "dropped"
        response.headers["Keep-Alive"] = "timeout=5"
        response.headers["X-Model-Note"] = "caf\u00e9 \u2603"  # not Latin-1: UTF-8 on the wire
        response.headers["X-Kept"] = "yes"
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    async with serve_app(app) as url:
        upstream = HttpUpstream("b", url, TimeoutsConfig())
        try:
            response = await upstream.open("/v1/chat/completions", b"{}", {})
            try:
                names = [name for name, _ in response.headers]
                assert b"x-kept" in names
                assert b"content-type" in names
                for gone in (b"connection", b"x-hop-named", b"keep-alive", b"server", b"date"):
                    assert gone not in names
                assert all(name == name.lower() for name in names)
                note = dict(response.headers)[b"x-model-note"]
                assert note == "caf\u00e9 \u2603".encode()  # the bytes as sent, not re-encoded
            finally:
                response.release()
        finally:
            await upstream.close()


def test_a_json_label_is_kept_and_any_other_becomes_json() -> None:
    sent = {"content-type": "application/json", "x-a": "1"}
    assert upstream_content_type(sent, b"{}") is sent  # nothing rewritten
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert upstream_content_type(form, b"{}") == {"content-type": "application/json"}
    multipart = {"content-type": "multipart/form-data; boundary=x"}
    assert upstream_content_type(multipart, b"--x") == multipart
    assert upstream_content_type({}, b"{}") == {"content-type": "application/json"}
    assert upstream_content_type({"x": "1"}, b"") == {"x": "1"}  # no body: as it is

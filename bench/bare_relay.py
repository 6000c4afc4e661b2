"""A bare relay: uvicorn (httptools, uvloop when installed) and one aiohttp session, no logic.

The yardstick of `bench/overhead.py`: what relaying a request costs with nothing else,
so the gateway's CPU per request can be stated against it rather than against the
machine. It reads the request body, sends it to the same path upstream with its
content type (one keep-alive `ClientSession`, `auto_decompress` off, as the gateway's
`app.upstreams.http`), and relays the status, the content type and the body chunk by
chunk (`iter_any`). No routing, no keys, no metrics, no log, no timeouts but connect.

    python -m bench.bare_relay --upstream http://127.0.0.1:8001 --port 8002
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn
from starlette.types import Message, Receive, Scope, Send


class BareRelay:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = {"content-type": "application/json"}
        for name, value in scope["headers"]:
            if name == b"content-type":
                headers["content-type"] = value.decode("latin-1")
        assert self.session is not None
        url = self.upstream + scope["path"]
        async with self.session.request(scope["method"], url, data=body, headers=headers) as up:
            out = [(b"content-type", up.headers.get("content-type", "").encode("latin-1"))]
            await send({"type": "http.response.start", "status": up.status, "headers": out})
            async for chunk in up.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                    auto_decompress=False,
                    skip_auto_headers=("User-Agent", "Accept-Encoding"),
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def health(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def app_for(upstream: str) -> Any:
    relay = BareRelay(upstream)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            await health(scope, receive, send)
            return
        await relay(scope, receive, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8001")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    a = parser.parse_args()
    uvicorn.run(
        app_for(a.upstream),
        host=a.host,
        port=a.port,
        http="httptools",
        ws="none",
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )


if __name__ == "__main__":
    main()

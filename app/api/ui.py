"""The control page: `GET /ui` (and `/` redirects there), its scripts and stylesheet.

The files shipped in the package (`app/api/page/`: the page, its stylesheet, its scripts),
each read once when first asked, served with no outside asset and no build step. The page
holds no secret: what it shows comes from the admin endpoints (`/status/stream`,
`/activity`, a backend's logs, the actions), with the admin key the user types kept in
the tab's sessionStorage, or from loopback when no admin key is set.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Final

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

_PAGE = files("app.api") / "page"
_FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "bars.js": "text/javascript; charset=utf-8",
    "backends.js": "text/javascript; charset=utf-8",
    "panels.js": "text/javascript; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
# The page may only talk to this gateway, and nothing may frame it.
_HEADERS: Final = {
    "cache-control": "no-cache",
    "content-security-policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
}


@cache
def _body(name: str) -> bytes:
    """A file of the page, read once, on its first request (nothing is read at import)."""
    return (_PAGE / name).read_bytes()


def _serve(name: str) -> Route:
    media_type = _FILES[name]

    async def handle(request: Request) -> Response:
        return Response(_body(name), media_type=media_type, headers=_HEADERS)

    path = "/ui" if name == "index.html" else f"/ui/{name}"
    return Route(path, handle, methods=["GET"], include_in_schema=False)


async def _root(request: Request) -> Response:
    return RedirectResponse("/ui", status_code=307)


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204)  # browsers ask; a 404 would be a console error


routes: list[BaseRoute] = [
    Route("/", _root, methods=["GET"], include_in_schema=False),
    Route("/favicon.ico", _no_icon, methods=["GET"], include_in_schema=False),
    *(_serve(name) for name in _FILES),
]

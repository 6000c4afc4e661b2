"""docs/api.md's endpoint table lists every route the gateway has, and only those.

The routes are read from the app `create_app` builds (its admin routers, the data plane's
routes, the control page, the schema); the table from the "Endpoints" section of the page.
A route added without its row, or a row left behind by a route that went, fails here
naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import pytest
from starlette.routing import BaseRoute, Route

from app.main import create_app
from tests.docs import page, section
from tests.fakes.servers import gateway_settings

METHOD = re.compile(r"[A-Z]+")
CELL_CODE = re.compile(r"`([^`]+)`")
PARAM = re.compile(r"\{[^}]*\}")

# Routes the table leaves out on purpose: the control page's own files, loaded by the page
# `GET /ui` serves (its row), and the browser's icon request, answered 204 so it is not a
# 404 in the log. None is an API.
UNDOCUMENTED = re.compile(r"/ui/[\w-]+\.(js|css)|/favicon\.ico")


def shape(path: str) -> str:
    """A path with each parameter as `{}`: the table names them for readers (`{id}`), the
    routes for handlers (`{response_id}`, `{model:path}`)."""
    return PARAM.sub("{}", path.split("?")[0])


def flat(routes: Iterable[BaseRoute]) -> Iterator[Route]:
    """Every route, those of included routers too (FastAPI keeps an included router as
    one entry holding the original; none is included with a prefix)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from flat(inner.routes)
        elif isinstance(route, Route):
            yield route


def served() -> set[tuple[str, str]]:
    """(method, path shape) of every route; HEAD goes with GET, not listed apart."""
    app = create_app(gateway_settings({"m": {"url": "http://127.0.0.1:9", "models": ["m"]}}))
    return {
        (method, shape(route.path))
        for route in flat(app.routes)
        if not UNDOCUMENTED.fullmatch(route.path)
        for method in route.methods or ()
        if method != "HEAD"
    }


def endpoints(cell: str) -> set[tuple[str, str]]:
    """The (method, path shape) pairs one cell of the table names. A code span is
    `METHOD /path`, a lone `METHOD` that also applies to the next path
    (`GET`, `DELETE /v1/responses/{id}`), a lone `/path` with the methods before it
    (`POST /tokenize`, `/detokenize`), or `.../last` for the previous path with its last
    segment replaced; a query string (`?limit=`) is not part of the path."""
    found: set[tuple[str, str]] = set()
    pending: list[str] = []  # lone methods waiting for their path
    methods: list[str] = []
    path = ""
    for span in CELL_CODE.findall(cell):
        head, _, rest = span.partition(" ")
        if METHOD.fullmatch(head):
            pending.append(head)
            if not rest:
                continue
            methods, pending, span = pending, [], rest
        if span.startswith(".../"):
            span = path.rsplit("/", 1)[0] + span[3:]
        if not span.startswith("/") or not methods:
            raise ValueError(f"cannot read {span!r} in {cell!r}")
        path = span
        found.update((method, shape(path)) for method in methods)
    return found


def table(markdown: str) -> dict[tuple[str, str], str]:
    """Each (method, path shape) of the table's first column, with the cell naming it."""
    rows: dict[tuple[str, str], str] = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("endpoint", "---"):
            continue
        for endpoint in endpoints(cells[0]):
            rows[endpoint] = cells[0]
    return rows


def documented() -> dict[tuple[str, str], str]:
    return table(section(page("api"), "Endpoints"))


def test_a_cell_is_read_as_the_page_writes_it() -> None:
    assert endpoints("`GET`, `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`") == {
        ("GET", "/v1/responses/{}"),
        ("DELETE", "/v1/responses/{}"),
        ("POST", "/v1/responses/{}/cancel"),
    }
    assert endpoints("`POST /tokenize`, `/detokenize`") == {
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    }
    assert endpoints("`POST /vram/zones/{zone}/acquire`, `.../release`") == {
        ("POST", "/vram/zones/{}/acquire"),
        ("POST", "/vram/zones/{}/release"),
    }
    assert endpoints("`GET /activity?limit=&model=&key=`") == {("GET", "/activity")}
    assert endpoints("`GET /ui` (`/` redirects)") == {("GET", "/ui"), ("GET", "/")}
    with pytest.raises(ValueError, match="cannot read 'model'"):
        endpoints("`model`")


def test_the_table_is_read_row_by_row() -> None:
    markdown = (
        "| endpoint | auth | what |\n|---|---|---|\n"
        "| `GET /health` | open | `x-api-key` is not a path |\n"
        "| `POST /gone` | admin | a route that went |\n"
    )
    rows = table(markdown)
    assert set(rows) == {("GET", "/health"), ("POST", "/gone")}
    assert set(rows) - served() == {("POST", "/gone")}


def test_the_routes_are_all_found() -> None:
    routes = served()
    # A route of an included router, one of the data plane, the schema, the page.
    for route in [
        ("GET", "/backends"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/openapi.json"),
        ("GET", "/ui"),
    ]:
        assert route in routes
    assert not any(path.startswith("/ui/") for _, path in routes)


def test_every_route_has_its_row() -> None:
    rows = documented()
    missing = sorted(f"{method} {path}" for method, path in served() - rows.keys())
    assert not missing, f"routes missing from docs/api.md's endpoint table: {missing}"


def test_every_row_has_its_route() -> None:
    routes = served()
    stale = sorted(
        f"{m} {p} ({cell})" for (m, p), cell in documented().items() if (m, p) not in routes
    )
    assert not stale, f"rows of docs/api.md's endpoint table that no route serves: {stale}"

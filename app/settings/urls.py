"""Backends that share a server: one `host:port` is one server (a vLLM listens on one port
and serves one model), so two backends whose URLs reach the same `host:port` are one
server configured twice, however the URLs are written: the scheme, the path and the
spelling of the loopback address (`localhost`, `127.0.0.1`, `::1`) do not make another.

Refused (`check-config` and `serve` both say which backends and which address):
- any backend the gateway runs (process, docker, kubernetes) on the address of another:
  whichever server answers there passes both backends' health checks (a start "ready"
  at once, requests for one model sent to the other's server; at start-up both adopted);
- two external backends that send the same upstream model id (`models[0]`) there: the
  same model twice (give it more names with `aliases:` on one backend).

Allowed: external backends that send different model ids to one server that serves
several models (a router or an OpenAI-compatible server with many models, which a vLLM
is not): each backend is one of its models. Pure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from app.settings.backends import BackendConfig

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# Names that reach the gateway's own machine, as a URL's host.
_LOOPBACK_NAMES: Final = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
LOOPBACK: Final = "loopback"


def server_address(url: str) -> tuple[str, int]:
    """(host, port) of the server `url` reaches: the host lower-cased, every loopback
    spelling (`localhost`, `127.0.0.0/8`, `::1`, `0.0.0.0`) as `loopback`, the port the
    scheme's default when the URL has none."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    return (LOOPBACK if _is_loopback(host) else host), port


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def shared_server(backends: Mapping[str, BackendConfig]) -> str | None:
    """The first pair of backends configured on one server that may not share it (see
    the module docstring), as the problem to report; None when there is none."""
    seen: dict[tuple[str, int], list[str]] = {}
    for name, cfg in backends.items():
        address = server_address(cfg.url)
        for other in seen.get(address, ()):
            problem = _conflict(name, cfg, other, backends[other])
            if problem is not None:
                return problem
        seen.setdefault(address, []).append(name)
    return None


def _conflict(name: str, cfg: BackendConfig, other: str, first: BackendConfig) -> str | None:
    where = f"{cfg.url}" if cfg.url == first.url else f"{cfg.url} (= {first.url})"
    head = f"backends.{name}.url: {where} is the server of backend {other!r} too"
    managed = [n for n, c in ((other, first), (name, cfg)) if c.managed]
    if managed:
        runs = " and ".join(repr(n) for n in managed)
        return (
            f"{head}. One host:port is one server, and the gateway runs {runs} there "
            "itself: whichever server answers there passes both backends' health checks, "
            "so one would be taken for the other. Give each backend its own port (only "
            "external backends may share a server, one that serves several models)"
        )
    if cfg.served_model == first.served_model:
        return (
            f"{head}, and both send model {cfg.served_model!r}: one model configured "
            "twice. Keep one backend and list the other's names in its aliases:"
        )
    return None

"""From where a request may come: the `Origin` a browser page puts on its requests and the
`Host` it names. Pure: no I/O.

A web page of any site can make the visitor's browser send a "simple" request (a `POST`
with `Content-Type: text/plain`, no preflight) to a gateway on the visitor's machine or
network. The browser then says which page sent it in `Origin`; a request without `Origin`
comes from a program or from a page of the gateway itself (browsers leave `Origin` off
same-origin `GET`s). Admitted are an origin listed in `allowed_origins` and the gateway's
own origin (the scheme and the `Host` the request names); `app.api.origin_guard.OriginGuard`
says on which routes the others are refused.

DNS rebinding gives a page of another site an origin whose host name resolves to the
gateway: its requests name that host in `Host`, so "the own origin" holds only while `Host`
is a name of the gateway: a loopback name or address, the listen `host`, the host of an
allowed origin or one of `allowed_hosts` (`*`: any). Routes that need a key do not depend
on it: a browser attaches no `Authorization` to a page's request on its own.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from app.settings.origins import ANY_HOST
from app.settings.root import Settings, is_loopback

_DEFAULT_PORT_SUFFIX: Final = {"http": ":80", "https": ":443"}


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    allowed: frozenset[str] = frozenset()  # origins, as browsers write them
    hosts: frozenset[str] | None = frozenset()  # trusted `Host` names besides loopback; None: any

    @classmethod
    def from_settings(cls, settings: Settings) -> OriginPolicy:
        if ANY_HOST in settings.allowed_hosts:
            return cls(frozenset(settings.allowed_origins), None)
        names = {*settings.allowed_hosts, _name(settings.host)}
        names.update(_name(urlsplit(o).hostname or "") for o in settings.allowed_origins)
        return cls(frozenset(settings.allowed_origins), frozenset(names - {""}))

    def listed(self, origin: str) -> bool:
        return origin in self.allowed

    def host_trusted(self, host: str | None) -> bool:
        """Whether `host` (a `Host` header) names this gateway. A request without one is
        not a browser's (browsers always send it)."""
        if host is None or self.hosts is None:
            return True
        name = host_name(host)
        return is_loopback(name) or name in self.hosts

    def same_origin(self, origin: str, scheme: str, host: str | None) -> bool:
        """Whether `origin` is the one the request's `Host` and scheme make."""
        if not host:
            return False
        authority = host.strip().lower()
        suffix = _DEFAULT_PORT_SUFFIX.get(scheme)
        if suffix is not None and authority.endswith(suffix):
            authority = authority[: -len(suffix)]
        return origin == f"{scheme}://{authority}"


def host_name(host: str) -> str:
    """The name or address of a `Host` header, without port or IPv6 brackets."""
    text = host.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        return _name(text[1:end]) if end > 0 else text
    if text.count(":") == 1:
        text = text.partition(":")[0]
    return _name(text.removesuffix("."))


def _name(text: str) -> str:
    """An address in one spelling (`::1`, not `0:0::1`); a name as it is."""
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return text.lower()


def origin_refused(origin: str) -> str:
    """The error message for a refused `Origin`."""
    return (
        f"Requests from the web page origin {origin[:200]!r} are not accepted here: a page "
        "of another site cannot drive this gateway. List it in "
        "MICROSCHEDULER_ALLOWED_ORIGINS if it is yours."
    )


def host_refused(host: str) -> str:
    """The error message for a refused `Host`."""
    return (
        f"The Host {host[:200]!r} is not a name of this gateway (DNS rebinding?). Use "
        "localhost or the listen address, or add the name a reverse proxy uses to "
        "MICROSCHEDULER_ALLOWED_HOSTS."
    )

"""Where browsers may call the gateway from: `allowed_origins` and `allowed_hosts` (root
`Settings` fields, `MICROSCHEDULER_ALLOWED_ORIGINS` / `MICROSCHEDULER_ALLOWED_HOSTS`).

Each is a list: in YAML a list, in the environment comma-separated (or a JSON list). An
origin is written as a browser sends it in `Origin` (`scheme://host[:port]`, no path); a
host is a name or an IP address, without port (any port of it is accepted). `*` alone in
`allowed_hosts` turns the `Host` check off. `app.access.origins` applies them.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Final
from urllib.parse import urlsplit

ANY_HOST: Final = "*"
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# A DNS name (labels of letters, digits, `-` and `_`), at most 253 characters.
_NAME: Final = re.compile(r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_-]{1,63})*$")


def split_list(value: object) -> object:
    """An environment value as a list: a JSON list, or comma-separated words."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError("must be a JSON list or comma-separated values") from None
    return [item.strip() for item in text.split(",") if item.strip()]


def origin(value: str) -> str:
    """`value` as browsers serialise an origin (lower case, no default port, no `/`)."""
    text = value.strip()
    like = "like https://chat.example.com or http://localhost:3000"
    if text in ("*", "null"):
        raise ValueError(f"{text!r} is not allowed: list each origin, {like}")
    parts = urlsplit(text)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or "://" not in text:
        raise ValueError(f"must be an origin, {like}; got {value!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"an origin has no user:password@; got {value!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or text.endswith("?"):
        raise ValueError(f"an origin has no path, query or fragment, {like}; got {value!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"must be an origin with a valid port; got {value!r}") from None
    name = host(parts.hostname)
    authority = f"[{name}]" if ":" in name else name
    if port is not None and port != _DEFAULT_PORTS[parts.scheme]:
        authority += f":{port}"
    return f"{parts.scheme}://{authority}"


def host(value: str) -> str:
    """A host name or IP address (lower case; an IPv6 address without brackets)."""
    text = value.strip().lower()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        pass
    if not _NAME.match(text):
        raise ValueError(
            f"must be a host name or IP address without scheme or port (like "
            f"gpu.example.com or 10.0.0.5), or {ANY_HOST!r} alone; got {value!r}"
        )
    return text


def hosts(values: tuple[str, ...]) -> tuple[str, ...]:
    """`allowed_hosts`, checked: names or addresses, or `*` alone."""
    if ANY_HOST in values:
        if len(values) > 1:
            raise ValueError(f"{ANY_HOST!r} turns the Host check off: list it alone")
        return values
    return tuple(host(value) for value in values)

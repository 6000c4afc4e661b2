"""What `serve` says about its address: the banner of `serve --banner` (`make run`), with
the address it bound, and the error for a port that is taken, naming the ways out and,
when it can tell, what holds the port.

The port comes from `--port`, else `MICROSCHEDULER_PORT`, else `port:` of models.yaml,
else 8080 (`app.settings`); `make run PORT=N` passes `--port N`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from app.upstreams.control_http import HTTPError, InvalidURL, Timeout, sync_client

if TYPE_CHECKING:
    from pathlib import Path

    from app.settings import Settings

#: How long `serve` asks a taken port who holds it (`GET /health`).
PROBE_TIMEOUT_S: Final = 1.0

WAYS_OUT: Final = (
    "another port: --port N, MICROSCHEDULER_PORT=N, `port: N` in models.yaml, or make run PORT=N"
)


def url_host(host: str) -> str:
    """`host` as the host of a URL a client on this machine can open: a wildcard
    address (every interface) as loopback, an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def base_url(host: str, port: int) -> str:
    return f"http://{url_host(host)}:{port}"


def try_model(settings: Settings) -> str | None:
    """A model name to try: a lazy backend's (the request shows it waking), else the
    first backend's; its first alias, else its first model."""
    backends = list(settings.backends.values())
    lazy = [b for b in backends if b.lifecycle == "lazy"]
    for backend in lazy or backends:
        names = backend.aliases or backend.models
        if names:
            return names[0]
    return None


def banner(settings: Settings, config: Path | None, host: str, port: int) -> str:
    """Where the gateway serves (the address bound) and a request to try."""
    url = base_url(host, port)
    where = settings.config_dir if config is None else config
    lines = [
        f"microscheduler: serving {where} on {url} (Ctrl-C stops it and its backends).",
        f"Open {url}/ for the control page.",
    ]
    model = try_model(settings)
    if model is not None:
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": True}
        )
        lines += [
            f"Once the log says 'backend ready', try (a request for {model} wakes it if needed):",
            f"  curl -sN {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'",
        ]
    return "\n".join(lines) + "\n"


def holder_of(host: str, port: int) -> str | None:
    """What answers on the taken port, as far as `GET /health` tells within
    `PROBE_TIMEOUT_S`: None when nothing answers HTTP there."""
    try:
        with sync_client(timeout=Timeout(PROBE_TIMEOUT_S)) as client:
            response = client.get(f"{base_url(host, port)}/health")
    except (HTTPError, InvalidURL):
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code == 200 and body == {"status": "ok"}:
        return "another microscheduler, by its answer to GET /health"
    return f"an HTTP server, by its answer to GET /health (HTTP {response.status_code})"


def in_use_message(host: str, port: int, reason: str, holder: str | None) -> str:
    """The error for a port that cannot be bound because it is taken: `holder`, what
    answers there (`holder_of`), when known."""
    held = f"; it is held by {holder}" if holder else ""
    return (
        f"cannot listen on {host}:{port}: {reason}{held}; stop what holds port {port}, "
        f"or choose {WAYS_OUT}"
    )

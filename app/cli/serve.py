"""`microscheduler serve` (run the gateway) and `microscheduler check-config` (validate the
configuration and say what it holds)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from app.cli.common import OK, add_config_option, guarded, load_config

if TYPE_CHECKING:
    from app.settings import Settings


def add_serve_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="run the gateway")
    add_config_option(serve)
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.add_argument(
        "--watch-config",
        action="store_true",
        help="reload the configuration when its files change (polled every 2 s)",
    )
    serve.set_defaults(func=guarded(run_serve, lambda _: "serve"))

    check = subparsers.add_parser("check-config", help="validate the configuration and exit")
    add_config_option(check)
    check.set_defaults(func=guarded(run_check_config, lambda _: "check-config"))


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app import logs
    from app.main import ReloadOptions, create_app

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = load_config(args.config, **overrides)
    logs.configure(settings.log_level)
    reload = ReloadOptions(sighup=True, watch=args.watch_config, overrides=overrides)
    uvicorn.run(create_app(settings, reload=reload), **server_options(settings))
    return OK


def server_options(settings: Settings) -> dict[str, Any]:
    """How the gateway runs uvicorn (`uvicorn.run`'s, `uvicorn.Config`'s arguments): for
    `serve`, and for tests that need the real server."""
    from app.api.connections import GatewayProtocol

    server = settings.server
    return {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        "server_header": False,
        # A timeout for asyncio.wait_for: a float works (0.5 s must not become 0).
        "timeout_graceful_shutdown": settings.shutdown_grace_s,
        # The server's limits (`ServerConfig` says why): httptools with a header timeout,
        # a 431 for a head over `max_header_bytes` and `max_connections` evicting idle ones.
        "http": GatewayProtocol.configured(server),
        # The gateway serves no WebSocket: an upgrade is an ordinary HTTP request (a 404).
        # With a WebSocket library loaded, its handshake logged every request header, the
        # client's Authorization included, at DEBUG.
        "ws": "none",
        "timeout_keep_alive": server.keep_alive_s,
        "backlog": server.backlog,
        # Not uvicorn's: it counts idle connections and answers the new request 503.
        "limit_concurrency": None,
    }


def run_check_config(args: argparse.Namespace) -> int:
    settings = load_config(args.config)
    names = sum(len(b.names) for b in settings.backends.values())
    print(
        f"{settings.config_dir}: configuration is valid "
        f"({len(settings.backends)} backends, {names} model names)"
    )
    for name, backend in settings.backends.items():
        served = ", ".join(backend.names)
        where = "" if backend.host is None else f" on {backend.host}"
        print(f"  {name}: {backend.url} [{backend.runtime.kind}{where}] serves {served}")
    for name, backend in settings.backends.items():
        for warning in backend.warnings():
            print(f"warning: backends.{name}.{warning}")
    return OK

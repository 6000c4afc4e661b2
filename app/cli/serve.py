"""`microscheduler serve` (run the gateway) and `microscheduler check-config` (validate the
configuration and say what it holds).

`serve` binds its address before the app starts: a port already taken (a second
`make run`) fails at once with `error: serve: cannot listen on ...: address already in
use`, what answers there (another microscheduler?) and the ways to another port, exit 1,
before any backend is started or any VRAM is asked for. The address is `--host/--port`,
else the settings' (`MICROSCHEDULER_HOST/_PORT`, else `host:/port:` of models.yaml, else
127.0.0.1:8080). `--banner` (`make run`) prints the address bound and a request to try.
It then locks its state directory (`app.store.dir_lock`): a second gateway on the same
directory fails with exit 1, naming the holder's pid and address. It raises its soft file
limit to the hard one and sizes the connection cap from it (`app.api.capacity`), logged
with a warning when it is low; `check-config` gives the same warning.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import socket
from typing import TYPE_CHECKING, Any

from app.cli.common import FAILED, OK, Subparsers, add_config_option, error, guarded, load_config
from app.cli.serve_address import banner, holder_of, in_use_message
from app.store import dir_lock

if TYPE_CHECKING:
    from app.settings import Settings
    from app.upstreams.control_http import AsyncBaseTransport

logger = logging.getLogger(__name__)


def add_serve_commands(subparsers: Subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run the gateway")
    add_config_option(serve)
    serve.add_argument(
        "--host", default=None,
        help="bind address (default: $MICROSCHEDULER_HOST, else host: of models.yaml, "
        "else 127.0.0.1)",
    )  # fmt: skip
    serve.add_argument(
        "--port", type=int, default=None,
        help="port (default: $MICROSCHEDULER_PORT, else port: of models.yaml, else 8080)",
    )  # fmt: skip
    serve.add_argument(
        "--banner", action="store_true",
        help="print the address bound and a request to try (make run)",
    )  # fmt: skip
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
    from app.api.accept import GatewayServer
    from app.api.capacity import connection_cap, listen_backlog, raise_file_limit
    from app.main import ReloadOptions, create_app

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = load_config(args.config, **overrides)
    logs.configure(settings.log_level)
    cap = connection_cap(
        settings.server.max_connections,
        raise_file_limit(),
        listen_backlog(settings.server.backlog),
    )
    logger.info("connections: %s", cap.describe())
    if (low := cap.warning()) is not None:
        logger.warning("connections: %s", low)
    try:
        sockets = bind_sockets(settings.host, settings.port)
    except OSError as exc:
        host, port, reason = settings.host, settings.port, exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            error("serve", in_use_message(host, port, reason, holder_of(host, port)))
        else:
            error("serve", f"cannot listen on {host}:{port}: {reason}")
        return FAILED
    with contextlib.ExitStack() as bound:
        for sock in sockets:
            bound.enter_context(sock)
        port = sockets[0].getsockname()[1]  # the one bound: port 0 picks one
        try:
            lock = dir_lock.take(settings.state_dir, host=settings.host, port=port)
        except dir_lock.StateDirBusy as exc:
            error("serve", str(exc))
            return FAILED
        except OSError as exc:  # read-only: the store says so too, and refuses holds
            logger.warning("state directory not locked path=%s error=%s", settings.state_dir,
                           exc.strerror or exc)  # fmt: skip
        else:
            bound.callback(lock.release)
        if args.banner:
            print(banner(settings, args.config, settings.host, port), flush=True)
        logger.info("address bound host=%s port=%d: serving once the start-up completes",
                    settings.host, settings.port)  # fmt: skip
        reload = ReloadOptions(sighup=True, watch=args.watch_config, overrides=overrides)
        options = server_options(settings, cap.limit)
        slots = options["http"].slots
        app = create_app(settings, reload=reload, connections=lambda: slots.view(cap))
        server = GatewayServer(uvicorn.Config(app, **options), sockets, slots)
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises Ctrl-C again at the end
            server.run()
    return OK if server.started else FAILED


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """The listening address, bound (not yet listening) as asyncio's `create_server` binds
    `host` and `port` for uvicorn: every address the name resolves to (`localhost`: IPv4
    and IPv6 where both resolve; empty: every interface), `SO_REUSEADDR` (a restart does
    not wait out TIME_WAIT; a port another process listens on is still refused), IPv6
    sockets IPv6 only. Not inherited by the processes the gateway starts. Raises
    `OSError` (`EADDRINUSE`...) with none left open."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def server_options(settings: Settings, cap: int | None = None) -> dict[str, Any]:
    """How the gateway runs uvicorn (`uvicorn.run`'s, `uvicorn.Config`'s arguments): for
    `serve`, and for tests that need the real server. `cap`: the connection cap
    (`app.api.capacity`; None: `max_connections`, else this process's file limit)."""
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
        # a 431 for a head over `max_header_bytes`, a connection cap evicting idle ones.
        "http": GatewayProtocol.configured(server, cap),
        # The gateway serves no WebSocket: an upgrade is an ordinary HTTP request (a 404).
        # With a WebSocket library loaded, its handshake logged every request header, the
        # client's Authorization included, at DEBUG.
        "ws": "none",
        "timeout_keep_alive": server.keep_alive_s,
        "backlog": server.backlog,
        # Not uvicorn's: it counts idle connections and answers the new request 503.
        "limit_concurrency": None,
    }


def run_check_config(
    args: argparse.Namespace,
    *,
    nvml: object | None = None,
    docker_transport: AsyncBaseTransport | None = None,
) -> int:
    """`nvml` replaces the `pynvml` module `gpu.probe: auto` asks, `docker_transport` the
    Docker API's transport (tests)."""
    settings = load_config(args.config)
    names = sum(len(b.names) for b in settings.backends.values())
    backends = len(settings.backends)
    print(
        f"{settings.config_dir}: configuration is valid ({backends} backend"
        f"{'' if backends == 1 else 's'}, {names} model name{'' if names == 1 else 's'})"
    )
    for name, backend in settings.backends.items():
        served = ", ".join(backend.names)
        where = "" if backend.host is None else f" on {backend.host}"
        print(f"  {name}: {backend.url} [{backend.runtime.kind}{where}] serves {served}")
    for name, backend in settings.backends.items():
        for warning in backend.warnings():
            print(f"warning: backends.{name}.{warning}")
    from app.api.capacity import connection_cap, current_file_limit
    from app.gpu.auto import probe_warnings

    for warning in probe_warnings(settings, nvml=nvml):
        print(f"warning: {warning}")
    cap = connection_cap(settings.server.max_connections, current_file_limit())
    if (low := cap.warning()) is not None:
        print(f"warning: connections: {low}")
    from app.cli.cache_check import cache_warnings

    for warning in cache_warnings(settings, docker_transport=docker_transport):
        print(f"warning: {warning}")
    return OK

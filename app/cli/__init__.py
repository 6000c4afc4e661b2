"""`microscheduler serve | check-config | plan ...`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.cli.plan import add_plan_command
from app.cli.profile import add_profile_command
from app.settings import ConfigError, Settings, load_settings


def _load(args: argparse.Namespace, **overrides: Any) -> Settings | None:
    try:
        return load_settings(args.config, **overrides)
    except ConfigError as exc:
        print("microscheduler: invalid configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app import logs
    from app.main import create_app

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = _load(args, **overrides)
    if settings is None:
        return 1
    logs.configure(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    settings = _load(args)
    if settings is None:
        return 1
    names = sum(len(b.models) + len(b.aliases) for b in settings.backends.values())
    print(
        f"{settings.config_dir}: configuration is valid "
        f"({len(settings.backends)} backends, {names} model names)"
    )
    for name, backend in settings.backends.items():
        served = ", ".join([*backend.models, *backend.aliases])
        print(f"  {name}: {backend.url} [{backend.runtime.kind}] serves {served}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="microscheduler", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    config_help = "config directory (default: $MICROSCHEDULER_CONFIG_DIR or config/)"

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", type=Path, default=None, help=config_help)
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.set_defaults(func=_serve)

    check = commands.add_parser("check-config", help="validate the configuration and exit")
    check.add_argument("--config", type=Path, default=None, help=config_help)
    check.set_defaults(func=_check_config)

    add_plan_command(commands)
    add_profile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()

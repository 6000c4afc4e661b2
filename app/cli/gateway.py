"""The CLI's client of a running gateway's admin API (`profile`, `yield`, `restore`,
`status`, `ps`, `activity`, `usage`, `reload`): where it is, the admin key, one call, how
its failures read, and `show`: one call printed, as JSON with `--json`, else as text.

`--url` defaults to `$MICROSCHEDULER_URL`, then http://127.0.0.1:$MICROSCHEDULER_PORT (the
port a gateway started in the same environment listens on), then http://127.0.0.1:8080.
The admin key (sent
as a bearer token) comes from `--admin-key-file PATH`, `$MICROSCHEDULER_ADMIN_KEY`,
`$MICROSCHEDULER_ADMIN_KEY_FILE` or `~/.config/microscheduler/admin.key`
(`app.cli.admin_key`); without one the gateway accepts admin calls from loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from app.cli.admin_key import AdminKey, admin_key, where_keys_come_from
from app.cli.common import FAILED, OK, UNREACHABLE, error, seconds
from app.upstreams.control_http import (
    InvalidURL,
    Response,
    Timeout,
    TimeoutException,
    TransportError,
    sync_client,
)

FALLBACK_URL: Final = "http://127.0.0.1:8080"
URL_ENV: Final = "MICROSCHEDULER_URL"
PORT_ENV: Final = "MICROSCHEDULER_PORT"
CONNECT_TIMEOUT_S: Final = 5.0
#: How long a read (`GET`) of the admin API may take.
READ_TIMEOUT_S: Final = 10.0

JsonDict = dict[str, Any]


class Unreachable(Exception):
    """No HTTP answer from the gateway (exit 3)."""


class GatewayRefused(Exception):
    """The gateway answered with an error (exit 1)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


GatewayProblem = Unreachable | GatewayRefused


def reported(command: str, problem: GatewayProblem) -> int:
    """Print the one error line for a failed call; the exit code it means (3 or 1)."""
    if isinstance(problem, Unreachable):
        error(command, str(problem))
        return UNREACHABLE
    error(command, f"{problem} (HTTP {problem.status})")
    return FAILED


def default_url(environ: Mapping[str, str] = os.environ) -> str:
    """`$MICROSCHEDULER_URL`, else loopback on `$MICROSCHEDULER_PORT` (a whole number),
    else `FALLBACK_URL`."""
    url = environ.get(URL_ENV, "").strip()
    if url:
        return url
    port = environ.get(PORT_ENV, "").strip()
    return f"http://127.0.0.1:{port}" if port.isdigit() else FALLBACK_URL


def add_url_option(parser: argparse.ArgumentParser) -> None:
    """`--url` and `--admin-key-file`: where the gateway is and how to be let in."""
    parser.add_argument(
        "--url",
        default=None,
        help=f"the gateway (default: ${URL_ENV}, else http://127.0.0.1:${PORT_ENV}, "
        f"else {FALLBACK_URL})",
    )
    parser.add_argument(
        "--admin-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a file holding the gateway's admin key (default: $MICROSCHEDULER_ADMIN_KEY, "
        "$MICROSCHEDULER_ADMIN_KEY_FILE, else ~/.config/microscheduler/admin.key if it exists)",
    )


def add_call_options(parser: argparse.ArgumentParser, *, timeout_s: float, json_help: str) -> None:
    """`--url`, `--timeout` (default `timeout_s`) and `--json`: the options of a command
    that waits for the gateway to act (start, stop, activate, reload)."""
    add_url_option(parser)
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=timeout_s,
        help=f"seconds to wait for the answer (default {timeout_s:g})",
    )
    parser.add_argument("--json", action="store_true", help=json_help)


def url_of(args: argparse.Namespace) -> str:
    return (args.url or default_url()).rstrip("/")


def _headers(key_file: Path | None) -> tuple[dict[str, str], AdminKey | None]:
    """The request headers, with the admin key's bearer token when there is one;
    `KeyFileError` (an `OSError`: exit 2) for a named key file that cannot be read."""
    headers = {"Accept": "application/json"}
    key = admin_key(key_file)
    if key is not None:
        headers["Authorization"] = f"Bearer {key.value}"
    return headers, key


def _error_message(response: Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    text = " ".join(response.text.split())[:200]
    return f"HTTP {response.status_code} {response.reason_phrase}" + (f": {text}" if text else "")


def _refused(response: Response, key: AdminKey | None) -> GatewayRefused:
    message = _error_message(response)
    if response.status_code in (401, 403):
        if key is None:
            message += f" (no admin key was sent: {where_keys_come_from()})"
        else:
            message += f" (the admin key sent, from {key.source}, was refused)"
    return GatewayRefused(response.status_code, message)


def _unreachable(url: str, exc: Exception) -> Unreachable:
    if isinstance(exc, TimeoutException):
        return Unreachable(
            f"no answer from the gateway at {url} within the timeout ({type(exc).__name__})"
        )
    return Unreachable(f"cannot reach the gateway at {url}: {str(exc) or type(exc).__name__}")


def call(
    method: str,
    url: str,
    path: str,
    *,
    timeout: float,
    body: JsonDict | None = None,
    key_file: Path | None = None,
) -> JsonDict:
    """One admin call; `Unreachable` or `GatewayRefused` unless it answers a JSON object
    (`KeyFileError` before it for an unreadable `key_file`)."""
    headers, key = _headers(key_file)
    limits = Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout))
    try:
        with sync_client(base_url=url, headers=headers, timeout=limits) as client:
            response = client.request(method, path, json=body)
    except (TransportError, InvalidURL) as exc:
        raise _unreachable(url, exc) from None
    if response.is_error:
        raise _refused(response, key)
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise GatewayRefused(
            response.status_code, f"{method} {path}: the answer is not a JSON object"
        )
    return answer


def _whole(answer: JsonDict) -> Any:
    return answer


def show(
    args: argparse.Namespace,
    command: str,
    method: str,
    path: str,
    render: Callable[[Any], str],
    *,
    timeout: float = READ_TIMEOUT_S,
    view: Callable[[JsonDict], Any] = _whole,
    body: JsonDict | None = None,
) -> int:
    """One admin call (with `body` as JSON when given), printed: `view(answer)` (default:
    the whole answer) as JSON with `--json`, else as `render` writes it; a failed call as
    its error line. The exit code."""
    try:
        answer = call(
            method, url_of(args), path, timeout=timeout, body=body, key_file=args.admin_key_file
        )
    except (Unreachable, GatewayRefused) as exc:
        return reported(command, exc)
    shown = view(answer)
    print(json.dumps(shown) if args.json else render(shown))
    return OK


def follow(url: str, path: str, key_file: Path | None = None) -> Iterator[tuple[str, Any]]:
    """(event, data) of the server-sent events at `path`, until the gateway ends them.
    No read timeout: the stream sends a keep-alive comment every 15 s."""
    headers, key = _headers(key_file)
    timeout = Timeout(None, connect=CONNECT_TIMEOUT_S)
    try:
        with (
            sync_client(base_url=url, headers=headers, timeout=timeout) as client,
            client.stream("GET", path) as response,
        ):
            if response.is_error:
                response.read()
                raise _refused(response, key)
            event, data = "message", []
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    yield event, json.loads("\n".join(data))
                    event, data = "message", []
    except (TransportError, InvalidURL) as exc:
        raise _unreachable(url, exc) from None


def stream_text(
    url: str, path: str, params: dict[str, str], key_file: Path | None = None
) -> Iterator[str]:
    """The text/plain answer of an admin GET, chunk by chunk as it comes (no read
    timeout: a followed output may be quiet for long)."""
    headers, key = _headers(key_file)
    headers["Accept"] = "text/plain"
    timeout = Timeout(None, connect=CONNECT_TIMEOUT_S)
    try:
        with (
            sync_client(base_url=url, headers=headers, timeout=timeout) as client,
            client.stream("GET", path, params=params) as response,
        ):
            if response.is_error:
                response.read()
                raise _refused(response, key)
            yield from response.iter_text()
    except (TransportError, InvalidURL) as exc:
        raise _unreachable(url, exc) from None

"""A small async client for the Docker Engine API: ping, inspect, start, stop and logs.

It talks to a socket proxy (`http://docker-proxy:2375`) or straight to the engine's Unix
socket (`unix:///var/run/docker.sock`). The API version is negotiated the way the official
client does it: `GET /_ping` (un-versioned), read the `Api-Version` header, use the lower
of the server's and ours (`MAX_API_VERSION`); every later call is prefixed `/v{version}`.
Negotiation happens lazily on first use; a failed ping caches nothing, so the next call
tries again.

Every request has an explicit timeout and is sent once (no hidden retries). Every failure
is a `DockerError` (a `RuntimeFailure`) with a `reason` and a message for the operator:

    unreachable   cannot connect (proxy down, socket missing or not readable)
    timeout       the engine did not answer in time
    forbidden     403, usually the socket proxy's rules (the message names the permission)
    not_found     404, usually no such container (the message names the container)
    conflict      409, e.g. start of a paused container
    bad_request   400, e.g. an API version the engine does not support
    unsupported   the engine's API is older than MIN_API_VERSION
    server_error  5xx from the engine or the proxy
    unexpected    anything else (an unknown status, a malformed answer, a lost connection)
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.runtimes.base import RuntimeFailure, read_refusal
from app.runtimes.cache_dirs import Mount
from app.settings import DockerConfig
from app.upstreams.control_http import (
    AsyncBaseTransport,
    AsyncHTTPTransport,
    ConnectError,
    ConnectTimeout,
    HTTPError,
    PoolTimeout,
    Response,
    Timeout,
    TimeoutException,
    WriteTimeout,
    async_client,
)

logger = logging.getLogger(__name__)

MIN_API_VERSION = "1.24"  # the engine's hard floor; below it the API is not usable for us
MAX_API_VERSION = "1.47"  # the newest version this client was written against
STOP_GRACE_S = 5.0  # on top of `t` + timeout_s: the engine's kill after `t`, and slack
_URL_KEY = "docker.url / MICROSCHEDULER_DOCKER__URL"
_MAX_ERROR_TEXT = 200


class DockerError(RuntimeFailure):
    """A Docker Engine API call failed; `str(error)` says what to fix.

    `status` is the HTTP status when there was an answer (None for transport failures);
    `reason` is one of the short names in the module docstring.
    """

    def __init__(self, message: str, *, reason: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """The parts of `GET /containers/{id}/json` the runtime needs.

    `status` is `State.Status` ("created", "running", "paused", "restarting", "removing",
    "exited", "dead"); `running` is derived from it, not from `State.Running`, which is
    also true for paused containers. `health` is `State.Health.Status`, or None when the
    container has no HEALTHCHECK (the engine then omits `State.Health`).
    """

    id: str
    name: str
    status: str
    exit_code: int
    oom_killed: bool
    error: str
    health: str | None
    started_at: str
    finished_at: str
    tty: bool = False  # `Config.Tty`: its output is raw text, not multiplexed frames
    env: tuple[str, ...] = ()  # `Config.Env`: "NAME=value" (read for its cache directories)
    mounts: tuple[Mount, ...] = ()  # `Mounts` (MountPoint: `Type`, `Destination`)

    def environment(self) -> dict[str, str]:
        return dict(entry.partition("=")[::2] for entry in self.env)

    @property
    def running(self) -> bool:
        return self.status == "running"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _error_text(response: Response) -> str:
    """The engine's `{"message": ...}`, or a short plain-text rendering of anything else
    (a socket proxy answers 403/502/503 with HTML)."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        text = str(body["message"])
    else:
        raw = response.text
        text = re.sub(r"<[^>]*>", " ", raw)
    text = " ".join(text.split())
    if len(text) > _MAX_ERROR_TEXT:
        text = text[: _MAX_ERROR_TEXT - 3] + "..."
    return text or f"HTTP {response.status_code}"


def _permission_hint(method: str, path: str) -> str:
    """What the socket proxy must allow for `method path` (path without the version)."""
    action = re.fullmatch(r"/containers/[^/]+/(start|stop)", path)
    if method == "POST" and action is not None:
        verb = action.group(1)
        flag = "ALLOW_START" if verb == "start" else "ALLOW_STOP"
        return (
            f"allow container {verb} (microscheduler's haproxy config allows it; "
            f"Tecnativa docker-socket-proxy: CONTAINERS=1 POST=1; "
            f"linuxserver socket-proxy: CONTAINERS=1 {flag}=1)"
        )
    if re.fullmatch(r"/containers/[^/]+/logs", path):
        return (
            "allow reading container logs: GET /containers/{id}/logs?stdout=1&stderr=1&"
            "tail=N[&follow=1] (microscheduler's haproxy config allows it; Tecnativa "
            "docker-socket-proxy: CONTAINERS=1; linuxserver socket-proxy: CONTAINERS=1 "
            "ALLOW_LOGS=1)"
        )
    if path == "/_ping":
        return "allow ping (PING=1 on Tecnativa and linuxserver socket proxies; on by default)"
    if path.startswith("/containers") and method in ("GET", "HEAD"):
        return "allow reading containers (CONTAINERS=1 on Tecnativa and linuxserver socket proxies)"
    return f"allow {method} {path} in the socket proxy"


class DockerApi:
    """One client per gateway, shared by every docker backend; close it with `aclose()`.

    `transport` replaces the real one (tests); otherwise a `unix://PATH` URL connects to
    that socket and an `http(s)://` URL to that host.
    """

    def __init__(
        self,
        settings: DockerConfig,
        *,
        transport: AsyncBaseTransport | None = None,
        url_key: str = _URL_KEY,
    ) -> None:
        self._url = settings.url
        self._url_key = url_key  # where its URL is configured, for hints
        self._timeout_s = settings.timeout_s
        self._timeout = Timeout(settings.timeout_s)
        parts = urlsplit(settings.url)
        self._unix = parts.scheme == "unix"
        if self._unix:
            base_url = "http://docker"  # the host is ignored over a Unix socket, but required
            if transport is None:
                transport = AsyncHTTPTransport(uds=parts.path)
        else:
            base_url = settings.url
        # trust_env=False: an HTTP(S)_PROXY meant for the internet must not capture the
        # socket proxy (or, worse, replace the Unix socket transport).
        self._client = async_client(
            base_url=base_url, transport=transport, timeout=self._timeout, trust_env=False
        )
        self._version: str | None = None
        self._negotiate_lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return self._url

    @property
    def api_version(self) -> str | None:
        """The negotiated version, or None before the first successful ping."""
        return self._version

    async def aclose(self) -> None:
        await self._client.aclose()

    async def ping(self) -> str:
        """Ping the engine (always on the wire), negotiate, cache and return the version."""
        response = await self._send("GET", "/_ping", call_path="/_ping", ok=(200,))
        server = response.headers.get("Api-Version")
        if not server:
            # What the official client does when a proxy strips the header.
            logger.warning(
                "docker ping has no Api-Version header, assuming minimum url=%s version=%s",
                self._url,
                MIN_API_VERSION,
            )
            server = MIN_API_VERSION
        try:
            server_tuple = _version_tuple(server)
        except ValueError:
            raise DockerError(
                f"the Docker API at {self._url} sent an unreadable Api-Version {server[:40]!r}",
                reason="unexpected",
                status=response.status_code,
            ) from None
        if server_tuple < _version_tuple(MIN_API_VERSION):
            raise DockerError(
                f"the Docker API at {self._url} speaks API {server}, older than the minimum "
                f"{MIN_API_VERSION} microscheduler needs: upgrade the Docker engine",
                reason="unsupported",
                status=response.status_code,
            )
        version = server if server_tuple < _version_tuple(MAX_API_VERSION) else MAX_API_VERSION
        if version != self._version:
            logger.info(
                "docker api negotiated url=%s server_version=%s version=%s",
                self._url,
                server,
                version,
            )
        self._version = version
        return version

    async def inspect(self, container: str, *, config_key: str | None = None) -> ContainerInfo:
        """`GET /containers/{container}/json`, reduced to `ContainerInfo`."""
        response = await self._call(
            "GET", f"/containers/{container}/json", container=container, config_key=config_key
        )
        try:
            return _container_info(response.json())
        except (ValueError, KeyError, TypeError) as exc:
            raise DockerError(
                f"the Docker API at {self._url} sent an unreadable inspect answer for "
                f"container {container!r}: {type(exc).__name__}: {exc}",
                reason="unexpected",
                status=response.status_code,
            ) from None

    async def start(self, container: str, *, config_key: str | None = None) -> bool:
        """Start the container; return True when it was already running (304)."""
        response = await self._call(
            "POST",
            f"/containers/{container}/start",
            ok=(204, 304),
            container=container,
            config_key=config_key,
        )
        return response.status_code == 304

    async def stop(self, container: str, timeout_s: int, *, config_key: str | None = None) -> bool:
        """Stop the container: SIGTERM, then SIGKILL after `timeout_s` (Docker's `t`).

        The engine answers only once the container has exited, so the read timeout is
        `timeout_s` + `docker.timeout_s` + a few seconds. Returns True when it was already
        stopped (304).
        """
        if timeout_s < 0:
            raise ValueError(f"stop timeout must be >= 0 seconds, got {timeout_s}")
        timeout = Timeout(self._timeout_s, read=timeout_s + self._timeout_s + STOP_GRACE_S)
        response = await self._call(
            "POST",
            f"/containers/{container}/stop",
            params={"t": str(timeout_s)},
            http_timeout=timeout,
            ok=(204, 304),
            container=container,
            config_key=config_key,
        )
        return response.status_code == 304

    async def logs(
        self, container: str, *, tail: int, follow: bool, config_key: str | None = None
    ) -> AsyncIterator[bytes]:
        """Open `GET /containers/{container}/logs?stdout=1&stderr=1&tail=N[&follow=1]` (this
        query, in this order: the socket proxy allows exactly it); the body's bytes as
        they come (multiplexed frames unless the container has a TTY: `demultiplex`).
        A followed output has no read timeout: it ends when the container stops or the
        caller stops reading."""
        version = await self._negotiated()
        query = f"stdout=1&stderr=1&tail={int(tail)}" + ("&follow=1" if follow else "")
        path = f"/containers/{container}/logs"
        timeout = Timeout(self._timeout_s, read=None) if follow else self._timeout
        response = await self._send(
            "GET",
            f"/v{version}{path}?{query}",
            call_path=path,
            http_timeout=timeout,
            ok=(200,),
            container=container,
            config_key=config_key,
            stream=True,
        )
        return self._body(response, f"GET {path}")

    async def _body(self, response: Response, call: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except HTTPError as exc:
            raise DockerError(
                f"the Docker API at {self._url} failed during {call}: {_describe(exc)}",
                reason="unexpected",
            ) from None
        finally:
            await response.aclose()

    async def _negotiated(self) -> str:
        version = self._version
        if version is not None:
            return version
        async with self._negotiate_lock:
            if self._version is not None:  # someone else negotiated while we waited
                return self._version
            return await self.ping()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        http_timeout: Timeout | None = None,
        ok: tuple[int, ...] = (200,),
        container: str | None = None,
        config_key: str | None = None,
    ) -> Response:
        version = await self._negotiated()
        try:
            return await self._send(
                method,
                f"/v{version}{path}",
                call_path=path,
                params=params,
                http_timeout=http_timeout,
                ok=ok,
                container=container,
                config_key=config_key,
            )
        except DockerError as exc:
            if exc.status == 400 and "client version" in str(exc):
                # The engine changed under us (upgraded or replaced): negotiate again next time.
                self._version = None
            raise

    async def _send(
        self,
        method: str,
        url: str,
        *,
        call_path: str,
        params: dict[str, str] | None = None,
        http_timeout: Timeout | None = None,
        ok: tuple[int, ...],
        container: str | None = None,
        config_key: str | None = None,
        stream: bool = False,
    ) -> Response:
        """`stream`: the body is left unread on success (the caller reads and closes it)."""
        timeout = http_timeout or self._timeout
        call = f"{method} {call_path}"
        try:
            request = self._client.build_request(method, url, params=params, timeout=timeout)
            response = await self._client.send(request, stream=stream)
        except (ConnectError, ConnectTimeout) as exc:
            raise DockerError(
                f"cannot reach the Docker API at {self._url}: {_describe(exc)} "
                f"({self._reach_hint()})",
                reason="unreachable",
            ) from None
        except TimeoutException as exc:
            phase = {WriteTimeout: "write", PoolTimeout: "pool"}.get(type(exc), "read")
            limit = timeout.as_dict()[phase]
            raise DockerError(
                f"the Docker API at {self._url} did not answer {call} within "
                f"{limit if limit is not None else self._timeout_s:g}s ({phase} timeout)",
                reason="timeout",
            ) from None
        except HTTPError as exc:
            raise DockerError(
                f"the Docker API at {self._url} failed during {call}: {_describe(exc)}",
                reason="unexpected",
            ) from None
        logger.debug(
            "docker call method=%s path=%s status=%d", method, call_path, response.status_code
        )
        if response.status_code in ok:
            return response
        if stream:
            await read_refusal(response)
        raise self._status_error(response, method, call_path, container, config_key)

    def _reach_hint(self) -> str:
        if self._unix:
            return (
                "is Docker running, and the socket mounted and readable by this user? "
                f"see {self._url_key}"
            )
        return f"is the socket proxy running? see {self._url_key}"

    def _status_error(
        self,
        response: Response,
        method: str,
        path: str,
        container: str | None,
        config_key: str | None,
    ) -> DockerError:
        status = response.status_code
        text = _error_text(response)
        call = f"{method} {path}"
        if status == 404 and container is not None:
            where = f" ({config_key})" if config_key else ""
            return DockerError(
                f"container {container!r} not found{where}: {text}",
                reason="not_found",
                status=status,
            )
        if status == 403:
            return DockerError(
                f"the Docker API at {self._url} forbids {call} ({text}): "
                f"{_permission_hint(method, path)}",
                reason="forbidden",
                status=status,
            )
        if status == 409:
            reason = "conflict"
        elif status == 400:
            reason = "bad_request"
        elif status == 404:
            reason = "not_found"
        elif status >= 500:
            reason = "server_error"
        else:
            reason = "unexpected"
        return DockerError(
            f"the Docker API at {self._url} answered {status} to {call}: {text}",
            reason=reason,
            status=status,
        )


def _describe(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


class Demultiplexer:
    """Docker's multiplexed output (a container without a TTY): frames of an 8-byte header
    `[stream, 0, 0, 0, size as uint32 big-endian]` (stream 1 stdout, 2 stderr) and `size`
    bytes of payload, cut anywhere by the transport."""

    HEADER = 8

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames so far: (stream, payload)."""
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= self.HEADER:
            size = int.from_bytes(self._buffer[4:8], "big")
            end = self.HEADER + size
            if len(self._buffer) < end:
                break
            frames.append((self._buffer[0], bytes(self._buffer[self.HEADER : end])))
            del self._buffer[:end]
        return frames


def _container_info(body: Any) -> ContainerInfo:
    state = body["State"]
    health = state.get("Health")
    config = body.get("Config") or {}
    return ContainerInfo(
        id=str(body["Id"]),
        name=str(body.get("Name", "")).lstrip("/"),
        status=str(state["Status"]),
        exit_code=int(state.get("ExitCode", 0)),
        oom_killed=bool(state.get("OOMKilled", False)),
        error=str(state.get("Error", "")),
        health=str(health["Status"]) if isinstance(health, dict) else None,
        started_at=str(state.get("StartedAt", "")),
        finished_at=str(state.get("FinishedAt", "")),
        tty=bool(config.get("Tty", False)),
        env=tuple(str(e) for e in config.get("Env") or () if isinstance(e, str)),
        mounts=tuple(
            Mount(str(m.get("Type", "")), str(m.get("Destination", "")))
            for m in body.get("Mounts") or ()
            if isinstance(m, dict)
        ),
    )

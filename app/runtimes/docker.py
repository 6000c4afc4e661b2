"""A backend run as an existing Docker container, started and stopped through the API.

The container is created outside the gateway (compose, `docker create`); the gateway only
starts, stops and inspects it, and reads its output, usually through a socket proxy.
Containers outlive the gateway: on shutdown they keep running and are adopted when the
gateway starts again.

Its output (`logs`, `run_output`) is the engine's (`GET /containers/{id}/logs`), read as
it comes: demultiplexed from Docker's 8-byte frames, or raw text when the container has a
TTY (`Config.Tty`). The engine keeps a container's output across its restarts, so the
output of a run the gateway just started is followed from its end (`tail=0`); a run that
was already going (adopted) from its last `RUN_TAIL` lines.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Final

from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.runtimes.docker_api import ContainerInfo, Demultiplexer, DockerApi, DockerError
from app.runtimes.output import LineSplitter
from app.settings import DockerRuntimeConfig

logger = logging.getLogger(__name__)

_STILL_UP = frozenset({"running", "restarting", "paused"})
RUN_TAIL: Final = 500  # lines of an adopted run read back for its load progress


class DockerRuntime:
    kind = "docker"
    managed = True
    stop_on_shutdown = False

    def __init__(self, backend: str, config: DockerRuntimeConfig, api: DockerApi) -> None:
        """`api` is shared by every docker backend and closed by its owner, not here."""
        self._backend = backend
        self._config = config
        self._api = api
        self._config_key = f"backends.{backend}.runtime.container"
        self._fresh = True  # the last start started it (its earlier output is another run's)
        # The container it runs (with placements: the last one started).
        self._container = config.container_on(None)

    @property
    def container(self) -> str:
        return self._container

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        if self._config.placements is not None:
            self._container = self._config.container_on(tuple(sorted(gpus)))
        already_running = await self._api.start(self.container, config_key=self._config_key)
        self._fresh = not already_running
        logger.info(
            "container started backend=%s container=%s already_running=%s",
            self._backend,
            self.container,
            already_running,
        )

    async def stop(self) -> None:
        timeout_s = self._config.stop_timeout_s
        try:
            already_stopped = await self._api.stop(
                self.container, timeout_s, config_key=self._config_key
            )
        except DockerError as exc:
            if exc.reason != "not_found":
                raise
            logger.warning(
                "container to stop is gone, treating it as stopped backend=%s container=%s",
                self._backend,
                self.container,
            )
            return
        # The engine answers stop only once the container exited; confirm it anyway.
        try:
            info = await self._api.inspect(self.container, config_key=self._config_key)
        except DockerError as exc:
            if exc.reason != "not_found":
                raise
            logger.info(  # removed right after stopping (e.g. `--rm`): gone is stopped
                "container stopped and removed backend=%s container=%s",
                self._backend,
                self.container,
            )
            return
        if info.status in _STILL_UP:
            raise RuntimeFailure(
                f"container {self.container!r} ({self._config_key}) is still {info.status} "
                f"after a Docker stop with t={timeout_s}s; check its restart policy"
            )
        logger.info(
            "container stopped backend=%s container=%s already_stopped=%s status=%s exit_code=%d",
            self._backend,
            self.container,
            already_stopped,
            info.status,
            info.exit_code,
        )

    async def status(self) -> RuntimeStatus:
        info = await self._api.inspect(self.container, config_key=self._config_key)
        return _status_of(info)

    def describe(self) -> str:
        return f"docker container {self.container!r} via {self._api.url}"

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        info = await self._api.inspect(self.container, config_key=self._config_key)
        raw = await self._api.logs(
            self.container, tail=tail, follow=follow, config_key=self._config_key
        )
        return _lines(raw, tty=info.tty)

    async def run_output(self) -> AsyncIterator[str]:
        lines = await self.logs(tail=0 if self._fresh else RUN_TAIL, follow=True)
        async for line in lines:
            yield line


async def _lines(raw: AsyncIterator[bytes], *, tty: bool) -> AsyncIterator[str]:
    """Lines of a container's output: stdout and stderr each split on their own."""
    frames = None if tty else Demultiplexer()
    splitters: dict[int, LineSplitter] = {}
    try:
        async for chunk in raw:
            for stream, payload in [(1, chunk)] if frames is None else frames.feed(chunk):
                for line in splitters.setdefault(stream, LineSplitter()).feed(payload):
                    yield line
        for splitter in splitters.values():
            for line in splitter.flush():
                yield line
    finally:
        closer = getattr(raw, "aclose", None)
        if closer is not None:
            await closer()


def _status_of(info: ContainerInfo) -> RuntimeStatus:
    if info.status == "running":
        detail = "running" if info.health is None else f"running, health: {info.health}"
        return RuntimeStatus(running=True, detail=detail)
    if info.status == "created":
        return RuntimeStatus(running=False, detail="created (never started)")
    if info.status == "paused":
        return RuntimeStatus(running=False, detail="paused (unpause it with docker unpause)")
    if info.status == "restarting":
        detail = f"restarting after exit ({info.exit_code})"
    else:  # exited, dead, removing
        detail = f"{info.status} ({info.exit_code})"
    if info.oom_killed:
        detail += ", OOM-killed"
    if info.error:
        detail += f": {info.error}"
    return RuntimeStatus(running=False, exit_code=info.exit_code, detail=detail)

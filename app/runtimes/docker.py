"""A backend run as an existing Docker container, started and stopped through the API.

The container is created outside the gateway (compose, `docker create`); the gateway only
starts, stops and inspects it, usually through a socket proxy. Containers outlive the
gateway: on shutdown they keep running and are adopted when the gateway starts again.
"""

from __future__ import annotations

import logging

from app.runtimes.base import RuntimeFailure, RuntimeStatus
from app.runtimes.docker_api import ContainerInfo, DockerApi, DockerError
from app.settings import DockerRuntimeConfig

logger = logging.getLogger(__name__)

_STILL_UP = frozenset({"running", "restarting", "paused"})


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

    @property
    def container(self) -> str:
        return self._config.container

    async def start(self) -> None:
        already_running = await self._api.start(self.container, config_key=self._config_key)
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

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

With `placements:` (one created container per set of GPUs, `gpus: auto`), a start starts
the container of the GPUs admission chose; the one that runs is the backend's "current"
container (status, stop, logs). After a gateway restart nothing is known yet: status and
stop inspect each placement to find the one that runs, and status says its GPUs
(`RuntimeStatus.gpus`), so adoption places the backend there. Two placements of one
backend never run at once: they serve on one URL (port).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace
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
        self._fresh = True  # the last start started it (its earlier output is another run's)
        # Every container it may run: name -> (its config key, its GPUs; None: one container).
        self._keys: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        if config.placements is None:
            assert config.container is not None  # one of the two (DockerRuntimeConfig)
            self._keys[config.container] = (f"backends.{backend}.runtime.container", None)
        else:
            for i, placement in enumerate(config.placements):
                key = f"backends.{backend}.runtime.placements[{i}].container"
                self._keys[placement.container] = (key, tuple(sorted(placement.gpus)))
        # The container it runs (or ran last); None: not known yet (placements, after a
        # gateway restart, until a status, stop or start finds or picks it).
        self._current: str | None = config.container

    @property
    def container(self) -> str:
        """The container it runs (or ran last); with placements not known yet, the first."""
        return self._current or self._config.container_on(None)

    @property
    def _config_key(self) -> str:
        return self._keys[self.container][0]

    async def start(self, gpus: tuple[int, ...] = (0,)) -> None:
        if self._config.placements is not None:
            wanted = tuple(sorted(gpus))
            try:
                container = self._config.container_on(wanted)
            except KeyError:
                raise RuntimeFailure(
                    f"no container of backends.{self._backend}.runtime.placements is on GPUs "
                    f"{list(wanted)} (its placements: {self._placements_text()})"
                ) from None
            await self._refuse_another(container)
            self._current = container
        already_running = await self._api.start(self.container, config_key=self._config_key)
        self._fresh = not already_running
        logger.info(
            "container started backend=%s container=%s already_running=%s",
            self._backend,
            self.container,
            already_running,
        )

    async def _refuse_another(self, container: str) -> None:
        """A RuntimeFailure when another placement's container of this backend is up.

        Refused, not stopped first: the gateway did not start it (it adopts a running
        placement at its start and stops the one it runs), so someone else did, by hand or
        through a gateway that could not tell; stopping it could cut what they use it for,
        and the memory it holds was counted as another's when admission chose these GPUs.
        Two cannot run at once anyway: they serve on the backend's one URL (port)."""
        for other, (key, gpus) in self._keys.items():
            if other == container:
                continue
            try:
                info = await self._api.inspect(other, config_key=key)
            except DockerError as exc:
                if exc.reason == "not_found":
                    continue  # not created: not running either
                raise
            if info.status in _STILL_UP:
                raise RuntimeFailure(
                    f"cannot start container {container!r} of backend {self._backend}: "
                    f"container {other!r} ({key}, {_gpus_text(gpus)}) is {info.status}, "
                    "started outside this gateway, and both serve on the backend's URL; "
                    f"stop it (docker stop {other}) and the gateway starts the one it chose"
                )

    def _placements_text(self) -> str:
        return ", ".join(f"{name} on {_gpus_text(gpus)}" for name, (_, gpus) in self._keys.items())

    async def _running(self, *, missing_ok: bool) -> list[tuple[str, ContainerInfo]]:
        """Each placement's container that is up, inspected (after a gateway restart).
        A container not found is skipped when one is up or `missing_ok`, else its error
        (naming its `placements[i].container`) is raised."""
        found: list[tuple[str, ContainerInfo]] = []
        missing: DockerError | None = None
        for container, (key, _) in self._keys.items():
            try:
                info = await self._api.inspect(container, config_key=key)
            except DockerError as exc:
                if exc.reason != "not_found":
                    raise
                missing = missing or exc
                continue
            if info.status in _STILL_UP:
                found.append((container, info))
        if missing is not None and not found and not missing_ok:
            raise missing
        return found

    async def stop(self) -> None:
        if self._current is None:  # placements after a restart: stop what runs
            running = await self._running(missing_ok=True)
            if not running:
                logger.info("no placement container runs, nothing to stop backend=%s",
                            self._backend)  # fmt: skip
            for container, _ in running:  # one, unless started by hand as well
                self._current = container
                await self._stop_current()
            return
        await self._stop_current()

    async def _stop_current(self) -> None:
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
        if self._current is None:  # placements after a restart: find the one that runs
            running = await self._running(missing_ok=False)
            if len(running) > 1:
                names = " and ".join(repr(container) for container, _ in running)
                raise RuntimeFailure(
                    f"containers {names} of backend {self._backend} are all up, and they "
                    "serve on one URL: stop all but one (docker stop NAME)"
                )
            if not running:
                return self._status(await self._inspect())
            self._current, info = running[0]
            self._fresh = False  # it was going before this gateway
            return self._status(info)
        return self._status(await self._inspect())

    async def _inspect(self) -> ContainerInfo:
        return await self._api.inspect(self.container, config_key=self._config_key)

    def _status(self, info: ContainerInfo) -> RuntimeStatus:
        status = _status_of(info)
        gpus = self._keys[self.container][1]
        if gpus is None:
            return status
        # Which placement: its container in the detail, its GPUs for adoption.
        return replace(status, detail=f"{self.container}: {status.detail}", gpus=gpus)

    def describe(self) -> str:
        return f"docker container {self.container!r} via {self._api.url}"

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        if self._current is None:  # placements after a restart: the one that runs, if any
            await self.status()
        info = await self._inspect()
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


def _gpus_text(gpus: tuple[int, ...] | None) -> str:
    if gpus is None:
        return "its GPUs"
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(map(str, gpus))}"


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

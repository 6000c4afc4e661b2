"""`check-config`'s look at where each backend keeps its caches (`app.runtimes.cache_dirs`):
a process backend from its environment, a Docker backend from its container (each
placement's, with `runtime.placements`), inspected
through the configured Docker API (a few seconds at most; when it cannot be reached, the
check says so and is skipped). Kubernetes and external backends are not checked: their
volumes are the cluster's and the server's own business."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence

from app.runtimes.cache_dirs import container_warnings, process_warnings
from app.runtimes.docker_api import DockerApi, DockerError
from app.settings import LOCAL_HOST, DockerRuntimeConfig, ProcessRuntimeConfig, Settings
from app.upstreams.control_http import AsyncBaseTransport

INSPECT_TIMEOUT_S = 3.0


def cache_warnings(
    settings: Settings,
    environ: Mapping[str, str] | None = None,
    *,
    docker_transport: AsyncBaseTransport | None = None,
) -> list[str]:
    """`backends.NAME: ...` for each cache that does not outlive its server."""
    environ = os.environ if environ is None else environ
    found: list[str] = []
    docker: list[tuple[str, str]] = []  # (where, container): each placement's container
    for name, backend in settings.backends.items():
        runtime = backend.runtime
        if isinstance(runtime, ProcessRuntimeConfig):
            env = {**environ, **runtime.env}
            found += [f"backends.{name}: {w}" for w in process_warnings(env)]
        elif isinstance(runtime, DockerRuntimeConfig) and backend.host_name == LOCAL_HOST:
            if runtime.placements is None:
                docker += [(f"backends.{name}", container) for container in runtime.containers]
            else:  # each was created on its own: each is checked, and named
                docker += [
                    (f"backends.{name}.runtime.placements[{i}] ({container})", container)
                    for i, container in enumerate(runtime.containers)
                ]
    if docker:
        found += asyncio.run(_containers(settings, docker, docker_transport))
    return found


async def _containers(
    settings: Settings,
    containers: Sequence[tuple[str, str]],
    transport: AsyncBaseTransport | None,
) -> list[str]:
    config = settings.docker.model_copy(
        update={"timeout_s": min(settings.docker.timeout_s, INSPECT_TIMEOUT_S)}
    )
    api = DockerApi(config, transport=transport)
    found: list[str] = []
    try:
        for where, container in containers:
            try:
                info = await api.inspect(container)
            except DockerError as exc:
                if exc.status == 404:
                    continue  # not created yet: check-config says nothing of it today either
                return [
                    *found,
                    f"docker: caches not checked, the Docker API at {api.url} did not answer "
                    f"({exc})",
                ]
            env = info.environment()
            found += [f"{where}: {w}" for w in container_warnings(env, info.mounts)]
    finally:
        await api.aclose()
    return found

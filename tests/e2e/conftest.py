from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    """A system tool a test needs: CI must have it (fail); elsewhere, skip and say why."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("MICROSCHEDULER_REQUIRE_SYSTEM_TOOLS") or os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs it on CI machines")
        pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus)")
    return path


# --- Docker Engine, fake-vLLM containers and the socket proxy (tests/fakes/docker_env.py) ---

import contextlib  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

from tests.fakes import docker_env  # noqa: E402


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[docker_env.DockerEngine]:
    """The real engine at /var/run/docker.sock (fails in CI, skips elsewhere when absent).

    Containers labelled microscheduler.test=1 are removed before and after the session.
    """
    engine = docker_env.docker_engine()
    docker_env.remove_test_containers(engine)
    yield engine
    docker_env.remove_test_containers(engine)


@pytest.fixture(scope="session")
def fake_vllm_image(docker_engine: docker_env.DockerEngine) -> str:
    """The fake-vLLM image's tag, imported once (kept by tag across sessions)."""
    return docker_env.fake_vllm_image(docker_engine)


@pytest.fixture
def docker_proxy(docker_engine: docker_env.DockerEngine) -> Iterator[docker_env.DockerProxy]:
    """The project's haproxy socket proxy on 127.0.0.1 (`.url`, `.stop()`, `.start()`)."""
    with docker_env.docker_proxy(docker_engine.socket) as proxy:
        yield proxy


@pytest.fixture
def make_fake_vllm_container(
    docker_engine: docker_env.DockerEngine, fake_vllm_image: str
) -> Iterator[Callable[..., str]]:
    """`make(name, port, *, startup_delay=3.0, extra_args=(), ...)` creates (not starts)
    a fake-vLLM container and returns its name; all are force-removed after the test."""
    with contextlib.ExitStack() as stack:

        def make(name: str, port: int, **kwargs: Any) -> str:
            return stack.enter_context(
                docker_env.fake_vllm_container(name, port, engine=docker_engine, **kwargs)
            )

        yield make

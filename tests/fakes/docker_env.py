"""A real Docker Engine for end-to-end tests: the engine, a fake-vLLM image, test
containers and the project's own socket proxy (Debian's haproxy with
``deploy/docker-socket-proxy/haproxy.cfg``).

The helpers talk to the engine through its Unix socket with httpx (no Docker CLI), and
build no image from a registry: the fake-vLLM image is a tiny ``docker import`` of a few
directories (plus a static busybox when the host has one, for debugging); each container
bind-mounts the host's Python, its site-packages, the repository's ``app/`` and the
system library directories read-only, and runs ``python -m app.sim.vllm`` on the
host network, listening on 127.0.0.1 only.

A missing engine or haproxy fails the test in CI (``MICROSCHEDULER_REQUIRE_SYSTEM_TOOLS``
or ``CI`` set) and skips it elsewhere, like ``require_tool`` in ``tests/e2e/conftest.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import ROOT, free_port
from tests.fakes.waits import until_sync

DOCKER_SOCKET = Path("/var/run/docker.sock")
TEST_LABEL = "microscheduler.test"  # every container made here carries TEST_LABEL=1
FAKE_VLLM_IMAGE = "microscheduler-test/fake-vllm:local"
PROXY_CONFIG = ROOT / "deploy" / "docker-socket-proxy" / "haproxy.cfg"
API_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")


def _system_tools_required() -> bool:
    return bool(os.environ.get("MICROSCHEDULER_REQUIRE_SYSTEM_TOOLS") or os.environ.get("CI"))


def require_system(problem: str, *, hint: str) -> None:
    """Fail in CI (where `.ci/run` provides every tool), skip elsewhere; say why either way."""
    if _system_tools_required():
        pytest.fail(f"{problem}; .ci/run provides it on CI machines", pytrace=False)
    pytest.skip(f"{problem} ({hint})")


# --- the engine ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DockerEngine:
    """A reachable engine: its socket, `Api-Version` (max API it speaks) and version."""

    socket: Path
    api_version: str
    version: str

    def client(self, *, timeout: httpx.Timeout = API_TIMEOUT) -> httpx.Client:
        """A client straight to the engine's socket (not through any proxy)."""
        return engine_client(self.socket, timeout=timeout)


def engine_client(
    socket_path: Path | str = DOCKER_SOCKET, *, timeout: httpx.Timeout = API_TIMEOUT
) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(socket_path))
    return httpx.Client(transport=transport, base_url="http://docker", timeout=timeout)


def probe_engine(socket_path: Path | str = DOCKER_SOCKET) -> DockerEngine | str:
    """The engine at `socket_path`, or a sentence saying why it is not usable."""
    path = Path(socket_path)
    if not path.exists():
        return f"no Docker Engine socket at {path}"
    try:  # a socket file left by a dead engine: httpx's failed connect leaks its socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(5.0)
            probe.connect(str(path))
    except OSError as exc:
        return f"Docker Engine at {path} does not answer ({type(exc).__name__}: {exc})"
    try:
        with engine_client(path, timeout=httpx.Timeout(5.0)) as client:
            ping = client.get("/_ping")
            if ping.status_code != 200:
                return f"Docker Engine at {path} answers /_ping with {ping.status_code}"
            version = client.get("/version").json()
    except (httpx.HTTPError, OSError, ValueError) as exc:
        return f"Docker Engine at {path} does not answer ({type(exc).__name__}: {exc})"
    return DockerEngine(
        socket=path,
        api_version=ping.headers.get("api-version", str(version.get("ApiVersion", ""))),
        version=str(version.get("Version", "?")),
    )


def docker_engine(socket_path: Path | str = DOCKER_SOCKET) -> DockerEngine:
    """The engine, or fail (CI) / skip (elsewhere) with the reason."""
    found = probe_engine(socket_path)
    if isinstance(found, str):
        require_system(
            found,
            hint="install docker.io and start dockerd, e.g. "
            "dockerd --bridge=none --iptables=false --ip6tables=false",
        )
        raise AssertionError("unreachable")  # pragma: no cover
    return found


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    try:
        message = response.json().get("message", response.text)
    except ValueError:
        message = response.text
    raise RuntimeError(f"Docker Engine: {what}: {response.status_code} {message}")


# --- the fake-vLLM image ---------------------------------------------------------------------


def _image_tar() -> bytes:
    """A root file system of empty mount points, /tmp, a minimal /etc and maybe busybox."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in (
            ("bin", 0o755),
            ("etc", 0o755),
            ("tmp", 0o1777),
            ("proc", 0o555),
            ("sys", 0o555),
            ("dev", 0o755),
            ("usr", 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        files = {
            "etc/passwd": b"root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534::/tmp:/bin/sh\n",
            "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
            "etc/hosts": b"127.0.0.1 localhost\n",
        }
        busybox = Path("/bin/busybox")
        if busybox.is_file():
            files["bin/busybox"] = busybox.read_bytes()
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
        if "bin/busybox" in files:
            link = tarfile.TarInfo("bin/sh")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buffer.getvalue()


def fake_vllm_image(engine: DockerEngine | None = None) -> str:
    """Import the fake-vLLM base image once (idempotent: kept by tag); returns the tag."""
    engine = engine or docker_engine()
    with engine.client() as client:
        if client.get(f"/images/{FAKE_VLLM_IMAGE}/json").status_code == 200:
            return FAKE_VLLM_IMAGE
        repo, tag = FAKE_VLLM_IMAGE.rsplit(":", 1)
        response = client.post(
            "/images/create",
            params={
                "fromSrc": "-",
                "repo": repo,
                "tag": tag,
                "message": "microscheduler e2e: host Python is bind-mounted at run time",
            },
            content=_image_tar(),
            headers={"Content-Type": "application/x-tar"},
        )
        _raise_for(response, f"import {FAKE_VLLM_IMAGE}")
        # The import streams JSON progress; an error arrives as {"error": ...} with 200.
        for line in response.text.splitlines():
            if line.strip() and "error" in json.loads(line):
                raise RuntimeError(f"Docker Engine: import {FAKE_VLLM_IMAGE}: {line}")
    return FAKE_VLLM_IMAGE


def python_mounts() -> list[tuple[str, str]]:
    """(host source, container target) pairs that let the host's Python run in a container.

    The interpreter's prefix and the venv at their own paths, every sys.path directory,
    the repository's app/ (and nothing else of it), and the system library directories
    (resolved, since /lib is often a symlink into /usr/lib). Nested duplicates are dropped.
    """
    wanted: list[str] = [sys.base_prefix, sys.prefix, os.path.dirname(sys.executable)]
    wanted += [os.path.dirname(os.path.realpath(sys.executable))]
    wanted += [p for p in sys.path if p and os.path.isdir(p) and not _inside(p, str(ROOT))]
    wanted += [d for d in _LIBRARY_DIRS if os.path.isdir(d)]
    pairs = {(os.path.realpath(target), target) for target in wanted}
    pairs.add((str(ROOT / "app"), str(ROOT / "app")))
    chosen: list[tuple[str, str]] = []
    for source, target in sorted(pairs, key=lambda pair: (len(pair[1]), pair[1])):
        if not any(_covers(parent, target) for parent in chosen):
            chosen.append((source, target))
    return chosen


def _covers(mount: tuple[str, str], target: str) -> bool:
    """Whether `mount` already shows `target` as the host has it."""
    source, parent = mount
    if not _inside(target, parent):
        return False
    return os.path.realpath(target) == os.path.join(source, os.path.relpath(target, parent))


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def fake_vllm_command(
    port: int,
    *,
    model: str = "fake-model",
    startup_delay: float = 3.0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    flags = ["--host", "127.0.0.1", "--port", str(port), "--model", model]
    flags += ["--startup-delay", f"{startup_delay:g}", *extra_args]
    return [sys.executable, "-m", "app.sim.vllm", *flags]


def create_fake_vllm_container(
    engine: DockerEngine,
    name: str,
    port: int,
    *,
    model: str = "fake-model",
    startup_delay: float = 3.0,
    extra_args: Sequence[str] = (),
    stop_timeout_s: int | None = None,
    labels: dict[str, str] | None = None,
    tty: bool = False,
    mounts: Sequence[dict[str, Any]] = (),
) -> str:
    """Create (not start) the container (`tty`: with a terminal, so its output is raw,
    not multiplexed; `mounts`: more of `HostConfig.Mounts`); a leftover of the same name
    is removed first."""
    image = fake_vllm_image(engine)
    body: dict[str, Any] = {
        "Image": image,
        "Cmd": fake_vllm_command(
            port, model=model, startup_delay=startup_delay, extra_args=extra_args
        ),
        "WorkingDir": str(ROOT),
        "Env": [
            f"PYTHONPATH={ROOT}",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
            "HOME=/tmp",
        ],
        "Labels": {**(labels or {}), TEST_LABEL: "1"},
        "Tty": tty,
        "HostConfig": {
            "NetworkMode": "host",
            "Init": True,  # docker-init as PID 1: SIGTERM works even before Python is up
            "Mounts": [
                *(
                    {"Type": "bind", "Source": source, "Target": target, "ReadOnly": True}
                    for source, target in python_mounts()
                ),
                *mounts,
            ],
            "RestartPolicy": {"Name": "no"},
        },
    }
    if stop_timeout_s is not None:
        body["StopTimeout"] = stop_timeout_s
    with engine.client() as client:
        remove_container(engine, name)
        response = client.post("/containers/create", params={"name": name}, json=body)
        _raise_for(response, f"create {name}")
    return name


def remove_container(engine: DockerEngine, name: str) -> None:
    """Force-remove `name` if it exists (a running container is killed)."""
    with engine.client() as client:
        response = client.delete(f"/containers/{name}", params={"force": "1", "v": "1"})
        if response.status_code != 404:
            _raise_for(response, f"remove {name}")


@contextlib.contextmanager
def fake_vllm_container(
    name: str,
    port: int,
    *,
    model: str = "fake-model",
    startup_delay: float = 3.0,
    extra_args: Sequence[str] = (),
    stop_timeout_s: int | None = None,
    engine: DockerEngine | None = None,
    tty: bool = False,
) -> Iterator[str]:
    """A created (not started) fake-vLLM container named `name` on 127.0.0.1:`port`.

    Yields the name; always force-removes the container afterwards. Once started, the
    fake's port stays closed for `startup_delay` seconds plus ~0.5 s of Python start-up.
    """
    engine = engine or docker_engine()
    create_fake_vllm_container(
        engine,
        name,
        port,
        model=model,
        startup_delay=startup_delay,
        extra_args=extra_args,
        stop_timeout_s=stop_timeout_s,
        tty=tty,
    )
    try:
        yield name
    finally:
        remove_container(engine, name)


def inspect_container(engine: DockerEngine, name: str) -> dict[str, Any]:
    with engine.client() as client:
        response = client.get(f"/containers/{name}/json")
        _raise_for(response, f"inspect {name}")
        result: dict[str, Any] = response.json()
        return result


def container_logs(engine: DockerEngine, name: str, *, tail: int = 200) -> str:
    """stdout and stderr of a (non-TTY) container, demultiplexed; for failure messages."""
    with engine.client() as client:
        response = client.get(
            f"/containers/{name}/logs", params={"stdout": "1", "stderr": "1", "tail": str(tail)}
        )
    if not response.is_success:
        return f"(no logs: {response.status_code})"
    data, out = response.content, []
    while len(data) >= 8:
        size = int.from_bytes(data[4:8], "big")
        out.append(data[8 : 8 + size])
        data = data[8 + size :]
    return b"".join(out).decode(errors="replace")


def remove_test_containers(engine: DockerEngine) -> list[str]:
    """Force-remove every container labelled TEST_LABEL=1; returns their names."""
    with engine.client() as client:
        response = client.get(
            "/containers/json",
            params={"all": "1", "filters": json.dumps({"label": [f"{TEST_LABEL}=1"]})},
        )
        _raise_for(response, "list test containers")
        names = [c["Names"][0].lstrip("/") for c in response.json() if c.get("Names")]
    for name in names:
        remove_container(engine, name)
    return names


# --- the socket proxy ------------------------------------------------------------------------


def require_haproxy() -> str:
    path = shutil.which("haproxy")
    if path is None:
        require_system("haproxy is not installed", hint="Debian: apt-get install haproxy")
        raise AssertionError("unreachable")  # pragma: no cover
    return path


class DockerProxy:
    """Debian's haproxy running the project's proxy config on 127.0.0.1:`port`.

    `stop()` and `start()` (same port) simulate the proxy going down and coming back.
    """

    def __init__(
        self,
        haproxy: str,
        socket_path: Path,
        port: int,
        log_path: Path,
        config: Path = PROXY_CONFIG,
    ) -> None:
        self.haproxy = haproxy
        self.socket = socket_path
        self.port = port
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, timeout_s: float = 10.0) -> None:
        if self.running:
            return
        env = {
            **os.environ,
            "DOCKER_SOCKET": str(self.socket),
            "PROXY_BIND": f"127.0.0.1:{self.port}",
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.haproxy, "-db", "-f", str(self.config)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {proc.returncode}:\n{self.log()}")
            return _accepts(self.port)

        try:
            until_sync(listening, timeout_s=timeout_s, interval_s=0.02, what="haproxy to listen")
        except AssertionError:
            self.stop()
            raise

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """SIGTERM (haproxy's hard stop: open streams are cut), SIGKILL after `timeout_s`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def docker_proxy(
    socket_path: Path | str = DOCKER_SOCKET, *, config: Path = PROXY_CONFIG
) -> Iterator[DockerProxy]:
    """The socket proxy in front of `socket_path`, started; stopped (bounded) afterwards.

    `config` is the haproxy configuration (default: the project's); tests pass a modified
    copy to see how the gateway reports a permission the proxy does not grant.

    Yields a DockerProxy: `.url` is http://127.0.0.1:PORT; `.stop()`/`.start()` take it
    down and bring it back on the same port; `.log()` is haproxy's output (one line per
    request: method, path, status; never bodies).
    """
    haproxy = require_haproxy()
    with tempfile.TemporaryDirectory(prefix="microscheduler-proxy-") as tmp:
        proxy = DockerProxy(
            haproxy, Path(socket_path), free_port(), Path(tmp) / "haproxy.log", config
        )
        proxy.start()
        try:
            yield proxy
        finally:
            proxy.stop()

"""How many client connections the gateway takes at once: sized from the process's file
limit unless `server.max_connections` says so.

Every open file is a descriptor, and a process may hold at most `RLIMIT_NOFILE` of them;
past it `accept` fails with EMFILE and so does every upstream connect, log file and
SQLite open. A stream costs two: the client's socket and the upstream's (`FDS_PER_STREAM`).
`FDS_RESERVED` keep what the gateway holds besides: the state store, the logs, the
backends' output pipes and control-plane connections, and the sockets over the cap (the
probe reserve, the queue and the lingering refusals of `app.api.connections`).

`serve` first raises its soft limit to the hard one, as nginx (`worker_rlimit_nofile`),
Go programs (since Go 1.19) and vLLM itself (`vllm/utils/system_utils.py`, `set_ulimit`)
do: the soft limit is the one a process may raise itself, and its common default (1,024)
dates from `select()`. The hard limit is the administrator's (`ulimit -Hn`,
`LimitNOFILE=` of a systemd unit, `docker run --ulimit nofile=N:N`, a pod's runtime).

Only the raising (`raise_file_limit`) does I/O; the rest is arithmetic, tested without a loop.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable
from dataclasses import dataclass

FDS_PER_STREAM = 2  # the client's socket and the upstream's
FDS_RESERVED = 1024  # store, logs, backends' pipes, control plane, sockets over the cap
MIN_CONNECTIONS = 16  # however low the file limit: the gateway still serves a few
FEW_STREAMS = 4096  # fewer concurrent streams than this is worth a warning

GetLimit = Callable[[], tuple[int, int]]
SetLimit = Callable[[tuple[int, int]], None]


@dataclass(frozen=True)
class FileLimit:
    """The process's RLIMIT_NOFILE: `soft` (in force), `hard` (its ceiling), and the soft
    limit before `raise_file_limit` raised it (equal when nothing changed)."""

    soft: int
    hard: int
    before: int

    @property
    def raised(self) -> bool:
        return self.soft > self.before


@dataclass(frozen=True)
class ConnectionCap:
    """At most `limit` client connections at once; `configured`: set by
    `server.max_connections`, else sized from `files`. `backlog`: the listen queue in
    force (`server.backlog` capped by the kernel's `net.core.somaxconn`), when known."""

    limit: int
    configured: bool
    files: FileLimit
    backlog: int | None = None

    @property
    def source(self) -> str:
        return "max_connections" if self.configured else "file limit"

    @property
    def descriptors(self) -> int:
        """What `limit` streams need, with the gateway's own files."""
        return self.limit * FDS_PER_STREAM + FDS_RESERVED

    def describe(self) -> str:
        """One line for the start-up log and `/status`."""
        files = f"file limit {self.files.soft:,}"
        if self.files.raised:
            files += f", raised from {self.files.before:,}"
        if self.configured:
            return f"at most {self.limit:,} connections at once (server.max_connections; {files})"
        return (
            f"at most {self.limit:,} connections at once ({files}: {FDS_PER_STREAM} files a "
            f"stream, {FDS_RESERVED:,} kept for the gateway)"
        )

    def warning(self) -> str | None:
        """Why this cap will hurt, if it will: too few streams for agents and batch
        clients, or a configured cap the file limit cannot hold."""
        hard = self.files.hard
        if self.configured and self.descriptors > self.files.soft:
            return (
                f"server.max_connections {self.limit:,} needs about {self.descriptors:,} open "
                f"files, but the file limit is {self.files.soft:,} (hard {hard:,}): past it, "
                "connections and upstream connects fail with 'too many open files'. Lower "
                f"max_connections to {sized(self.files.soft):,} or raise the limit "
                f"({RAISE_HINT})."
            )
        if not self.configured and self.limit < FEW_STREAMS:
            return (
                f"the file limit ({self.files.soft:,}, hard {hard:,}) allows only "
                f"{self.limit:,} concurrent connections; agents and batch clients open "
                f"thousands of streams. Raise the hard limit ({RAISE_HINT}) to at least "
                f"{FEW_STREAMS * FDS_PER_STREAM + FDS_RESERVED:,}."
            )
        return None


RAISE_HINT = (
    "ulimit -Hn, LimitNOFILE= in a systemd unit, docker run --ulimit nofile=N:N, "
    "ulimits: in docker-compose.yml"
)


def sized(soft: int) -> int:
    """The connections a soft file limit holds: two files a stream, after the reserve."""
    return max(MIN_CONNECTIONS, (soft - FDS_RESERVED) // FDS_PER_STREAM)


def connection_cap(
    configured: int | None, files: FileLimit, backlog: int | None = None
) -> ConnectionCap:
    """The cap in force: the configured one, else what the file limit holds."""
    if configured is not None:
        return ConnectionCap(configured, configured=True, files=files, backlog=backlog)
    return ConnectionCap(sized(files.soft), configured=False, files=files, backlog=backlog)


SOMAXCONN = "/proc/sys/net/core/somaxconn"


def listen_backlog(asked: int, somaxconn: str = SOMAXCONN) -> int | None:
    """The listen queue the kernel gives for `asked` (listen(2): silently truncated to
    `net.core.somaxconn`); None where that is not readable (not Linux)."""
    try:
        with open(somaxconn, encoding="ascii") as f:
            return min(asked, int(f.read()))
    except (OSError, ValueError):
        return None


def raise_file_limit(
    get: GetLimit | None = None,
    set_: SetLimit | None = None,
) -> FileLimit:
    """Raise the soft RLIMIT_NOFILE to the hard one (children inherit it). An "unlimited"
    hard limit counts as 1,048,576 (the kernel's default `fs.nr_open`: no process opens
    more files); when the kernel refuses, the soft limit stays as it was."""
    get = get or _getrlimit
    set_ = set_ or (lambda limits: resource.setrlimit(resource.RLIMIT_NOFILE, limits))
    soft, hard = get()
    target = _finite(hard)
    if _finite(soft) < target:
        with contextlib.suppress(OSError, ValueError):  # the kernel refused: as it was
            set_((target, hard))
    return FileLimit(soft=_finite(get()[0]), hard=target, before=_finite(soft))


def current_file_limit(get: GetLimit | None = None) -> FileLimit:
    """The limit `serve` would run with (its soft limit raised to the hard one), without
    raising this process's: for `check-config`."""
    soft, hard = (get or _getrlimit)()
    finite = _finite(hard)
    return FileLimit(soft=max(_finite(soft), finite), hard=finite, before=_finite(soft))


def _getrlimit() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


_NR_OPEN = 1 << 20  # the kernel's default `fs.nr_open`: no process opens more files


def _finite(limit: int) -> int:
    return _NR_OPEN if limit == resource.RLIM_INFINITY else limit

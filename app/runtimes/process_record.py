"""What the gateway remembers of each process backend it started, so that after a crash
(an OOM kill, a SIGKILL) it finds its servers again instead of leaving them orphaned.

A record names the backend, the process (pid, its start time in clock ticks since boot:
`/proc/PID/stat` field 22, the boot it ran in, its command line), its port and a hash of
the backend's launch settings. At the next start a record is matched against what runs
now (`verdict`, pure):

- the process is gone, or the pid now belongs to another process (a different start
  time or boot): the record is dropped;
- the same process, but the configuration no longer wants it (backend removed, or its
  launch settings changed): it is stopped;
- the same process and still wanted: it is adopted (ready once it answers health, its
  memory counted as its backend's).

The records live in the state directory (`app.lifecycle.store.ProcessRecords`); the
runtime sees them through `RecordBook`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from app.settings import BackendConfig

logger = logging.getLogger(__name__)

PROC = Path("/proc")
BOOT_ID = PROC / "sys" / "kernel" / "random" / "boot_id"


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    backend: str
    pid: int
    start_time: int  # /proc/PID/stat field 22: clock ticks after boot
    boot_id: str
    # The argv it was started with, for logs and display only: not what /proc shows (a
    # console script such as `.../bin/vllm` reads `[.../python3.11, .../bin/vllm, ...]`
    # there, its `#!` interpreter first), and no part of its identity (`same_process`).
    cmdline: tuple[str, ...]
    port: int | None
    launch: str  # `launch_hash` of the backend's config when it was started
    stop_grace_s: float  # SIGTERM, then this long, then SIGKILL
    # The GPUs it was shown (CUDA_VISIBLE_DEVICES); None: a record of an earlier version.
    gpus: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        gpus = None if self.gpus is None else list(self.gpus)
        return {**asdict(self), "cmdline": list(self.cmdline), "gpus": gpus}

    @classmethod
    def from_json(cls, data: object) -> ProcessRecord | None:
        """None when `data` is not a record (written by another version, edited)."""
        if not isinstance(data, dict):
            return None
        try:
            record = cls(
                backend=str(data["backend"]),
                pid=int(data["pid"]),
                start_time=int(data["start_time"]),
                boot_id=str(data["boot_id"]),
                cmdline=tuple(str(word) for word in data.get("cmdline", ())),
                port=None if data["port"] is None else int(data["port"]),
                launch=str(data["launch"]),
                stop_grace_s=float(data["stop_grace_s"]),
                gpus=_gpus(data.get("gpus")),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return record if record.pid > 1 else None


def _gpus(value: object) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(g, int) for g in value):
        raise ValueError(f"gpus: {value!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Observed:
    """A live process as /proc shows it now."""

    start_time: int
    boot_id: str
    cmdline: tuple[str, ...]
    zombie: bool  # exited, not yet reaped: gone for our purposes


class Verdict(enum.StrEnum):
    ADOPT = "adopt"
    STOP = "stop"
    DROP = "drop"


def same_process(record: ProcessRecord, observed: Observed | None) -> bool:
    """The recorded process still runs: the pid is alive and was not reused (the same
    start time in the same boot).

    A process is its pid, its start time (clock ticks after boot, 100 a second on Linux) and the
    boot. For the pid to name another process with the same start time, ours would have
    had to exit and the kernel hand its pid out again, in this boot, to a process forked
    in the same tick (10 ms) as ours was; pids are handed out in turn up to `pid_max` before
    one is reused, so that is not a real risk.

    The command line is not compared: the one recorded is the argv as configured, and
    what /proc shows after the exec differs for a script run through its `#!` line
    (`[.../python3.11, .../bin/vllm, serve, ...]` for `[.../bin/vllm, serve, ...]`), and
    a program may rewrite its own (setproctitle)."""
    return (
        observed is not None
        and not observed.zombie
        and observed.start_time == record.start_time
        and observed.boot_id == record.boot_id
    )


def verdict(record: ProcessRecord, observed: Observed | None, wanted: str | None) -> Verdict:
    """What to do with a record found at start. `wanted`: the launch hash of the backend
    of that name as configured now (None: no such process backend)."""
    if not same_process(record, observed):
        return Verdict.DROP
    if wanted is None or wanted != record.launch:
        return Verdict.STOP
    return Verdict.ADOPT


def launch_hash(config: BackendConfig) -> str:
    """What a started server depends on: its runtime settings (command, env, cwd; not
    `stop_grace_s`) and its URL. Another value: the running server is not the one
    configured."""
    runtime = config.runtime.model_dump(mode="json", exclude={"stop_grace_s"})
    settings = {"url": config.url, "runtime": runtime}
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def observe(pid: int) -> Observed | None:
    """The process `pid` as /proc shows it; None when there is none."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:  # gone (or never was)
        return None
    # Field 2 is the command name in parentheses, which may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        state, start_time = fields[0], int(fields[19])  # fields 3 and 22
    except (IndexError, ValueError):
        return None
    cmdline = tuple(word.decode(errors="replace") for word in raw.split(b"\0")[:-1])
    return Observed(start_time, boot_id(), cmdline, zombie=state in ("Z", "X"))


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


class RecordBook(Protocol):
    """Where the records are kept. Never raises: a record that cannot be saved is logged
    (the process runs; only its adoption after a crash is lost)."""

    def records(self) -> Mapping[str, ProcessRecord]: ...

    def put(self, record: ProcessRecord) -> None: ...

    def drop(self, backend: str) -> None: ...


class MemoryBook:
    """Records kept in memory only (nothing survives the gateway)."""

    def __init__(self) -> None:
        self._records: dict[str, ProcessRecord] = {}

    def records(self) -> Mapping[str, ProcessRecord]:
        return dict(self._records)

    def put(self, record: ProcessRecord) -> None:
        self._records[record.backend] = record

    def drop(self, backend: str) -> None:
        self._records.pop(backend, None)

"""The simulated GPU's ledger: what each fake vLLM process holds on which GPU.

A directory of small JSON files, one per reporting process, written by the fake vLLM server
(``--sim-gpu-dir``) and summed per GPU by the gateway's simulated probe, so that used memory
in the demo and the tests is measured (as NVML would) rather than assumed from config.

Writers replace their file atomically (temp file + ``os.replace`` in the same directory),
so a reader sees a whole old file or a whole new one. Readers still skip anything they
cannot parse, and entries of processes that are gone:

- the pid is not alive (``os.kill(pid, 0)`` raises ProcessLookupError) or is a zombie;
  not checked when the entry says it was written from another PID namespace (a pid from
  a container means nothing here),
- the heartbeat (``updated_at``, wall clock) is older than ``stale_after_s``: a SIGKILLed
  process never removes its file, and its pid may be reused or live in another namespace.

Like NVML, an entry counts on each of its GPUs in full (``mib`` is per GPU, as with tensor
parallelism).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeGuard

__all__ = ["LedgerEntry", "LedgerWriter", "ledger_entries", "read_ledger"]

log = logging.getLogger(__name__)

_SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One process's footprint: ``mib`` on each GPU in ``gpus``."""

    pid: int
    gpus: tuple[int, ...]
    mib: int
    model: str
    port: int | None
    updated_at: float  # time.time() of the last write (heartbeat)
    pid_ns: str | None = None  # e.g. "pid:[4026531836]": the writer's PID namespace

    def to_json(self) -> bytes:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LedgerEntry | None:
        """The entry in ``raw``, or None if it is not a well-formed entry."""
        try:
            data = json.loads(raw)
        except ValueError:  # includes UnicodeDecodeError
            return None
        if not isinstance(data, dict):
            return None
        pid, gpus, mib = data.get("pid"), data.get("gpus"), data.get("mib")
        model, port, updated_at = data.get("model"), data.get("port"), data.get("updated_at")
        pid_ns = data.get("pid_ns")
        if not (_is_int(pid) and pid > 0 and _is_int(mib) and mib >= 0):
            return None
        if not isinstance(gpus, list) or not gpus or not all(_is_int(g) and g >= 0 for g in gpus):
            return None
        if not isinstance(model, str) or not (port is None or (_is_int(port) and port >= 0)):
            return None
        if isinstance(updated_at, bool) or not isinstance(updated_at, int | float):
            return None
        if not math.isfinite(updated_at) or not (pid_ns is None or isinstance(pid_ns, str)):
            return None
        return cls(pid, _distinct(gpus), mib, model, port, float(updated_at), pid_ns)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _distinct(gpus: Iterable[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(gpus))


def _pid_namespace() -> str | None:
    """This process's PID namespace (Linux), or None where there is no such thing."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


class LedgerWriter:
    """The writer side for one process: ``set_mib`` on load/sleep/wake, ``heartbeat``
    about every second, ``remove`` on clean shutdown.

    The file name is unique per writer (``{pid}-{random}.json``): pids collide across
    containers sharing the directory, and one process may host several writers (tests).
    After ``remove`` the writer stays removed: later calls write nothing.
    """

    def __init__(
        self,
        directory: Path,
        *,
        pid: int,
        gpus: Iterable[int],
        model: str,
        port: int | None,
    ) -> None:
        gpu_list = _distinct(gpus)
        if not gpu_list or any(g < 0 for g in gpu_list):
            raise ValueError(f"gpus must be non-negative GPU indexes, got {gpu_list!r}")
        if pid <= 0:
            raise ValueError(f"pid must be positive, got {pid}")
        self.directory = directory
        self.path = directory / f"{pid}-{uuid.uuid4().hex[:12]}{_SUFFIX}"
        self.pid = pid
        self.gpus = gpu_list
        self.model = model
        self.port = port
        self.mib = 0
        self._pid_ns = _pid_namespace()
        self._removed = False

    def entry(self) -> LedgerEntry:
        """What the next write will say (``updated_at`` is now)."""
        return LedgerEntry(
            self.pid, self.gpus, self.mib, self.model, self.port, time.time(), self._pid_ns
        )

    def set_mib(self, mib: int) -> None:
        """Report ``mib`` on each GPU (creates the directory and the file if needed)."""
        if mib < 0:
            raise ValueError(f"mib must be >= 0, got {mib}")
        self.mib = mib
        self._write()

    def heartbeat(self) -> None:
        """Rewrite the entry with a fresh ``updated_at`` (readers drop stale entries)."""
        self._write()

    def remove(self) -> None:
        self._removed = True
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _write(self) -> None:
        if self._removed:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(self.entry().to_json())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return True  # cannot tell: let the heartbeat decide
    # An exited child its parent has not reaped yet has freed its GPU memory already.
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self/stat").exists()  # no /proc at all: trust kill()
    except OSError:
        return True
    fields = stat.rpartition(b")")[2].split()  # "pid (comm) S ...": comm may hold spaces
    return not fields or fields[0] != b"Z"


def ledger_entries(directory: Path, *, now: float, stale_after_s: float = 5.0) -> list[LedgerEntry]:
    """Live entries in ``directory`` (sorted by GPUs, model, pid); a missing directory has
    none. ``now`` is wall-clock time (``time.time()``)."""
    try:
        paths = [p for p in directory.iterdir() if p.name.endswith(_SUFFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    own_ns = _pid_namespace()
    entries: list[LedgerEntry] = []
    for path in paths:
        if path.name.startswith("."):
            continue  # a writer's temp file
        try:
            raw = path.read_bytes()
        except OSError:  # removed meanwhile, a directory, unreadable
            continue
        entry = LedgerEntry.from_json(raw)
        if entry is None:
            log.debug("sim ledger: skipping malformed file=%s", path)
            continue
        if now - entry.updated_at > stale_after_s:
            continue
        same_ns = entry.pid_ns is None or entry.pid_ns == own_ns
        if same_ns and not _pid_alive(entry.pid):
            continue
        entries.append(entry)
    entries.sort(key=lambda e: (e.gpus, e.model, e.pid, e.port or 0))
    return entries


def read_ledger(directory: Path, *, now: float, stale_after_s: float = 5.0) -> dict[int, int]:
    """MiB in use per GPU index: the sum of live entries, each counted on each of its GPUs.
    GPUs without entries are absent. Blocking file I/O (a handful of small files)."""
    used: dict[int, int] = {}
    for entry in ledger_entries(directory, now=now, stale_after_s=stale_after_s):
        for gpu in entry.gpus:
            used[gpu] = used.get(gpu, 0) + entry.mib
    return used

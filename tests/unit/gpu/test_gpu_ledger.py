"""The simulated GPU's ledger: writers in real processes, a reader that survives their ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.gpu.ledger import LedgerEntry, LedgerWriter, ledger_entries, read_ledger
from tests.fakes.waits import until_sync

# A second process that reports 700 MiB on GPU 0 until its stdin closes (or it is killed).
_CHILD = """
import os, sys
from pathlib import Path
from app.gpu.ledger import LedgerWriter
w = LedgerWriter(Path(sys.argv[1]), pid=os.getpid(), gpus=[0], model="child", port=9001)
w.set_mib(700)
print("ready", flush=True)
sys.stdin.read()
w.remove()
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _writer(
    directory: Path, *, pid: int | None = None, gpus: tuple[int, ...] = (0,)
) -> LedgerWriter:
    return LedgerWriter(directory, pid=pid or os.getpid(), gpus=gpus, model="m", port=8001)


def _exited_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=10)
    return done.pid


def _now() -> float:
    return time.time()


def test_round_trip(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"  # created by the first write
    writer = _writer(ledger, gpus=(0,))
    before = time.time()
    writer.set_mib(1234)
    [entry] = ledger_entries(ledger, now=_now())
    assert entry == LedgerEntry(
        pid=os.getpid(),
        gpus=(0,),
        mib=1234,
        model="m",
        port=8001,
        updated_at=entry.updated_at,
        pid_ns=entry.pid_ns,
    )
    assert before <= entry.updated_at <= time.time()
    assert read_ledger(ledger, now=_now()) == {0: 1234}
    assert writer.path.parent == ledger
    assert writer.path.name.startswith(f"{os.getpid()}-")
    writer.set_mib(150)
    assert read_ledger(ledger, now=_now()) == {0: 150}
    assert [p.name for p in ledger.iterdir()] == [writer.path.name]  # no temp files left
    writer.remove()
    assert read_ledger(ledger, now=_now()) == {}
    assert list(ledger.iterdir()) == []
    writer.set_mib(99)  # a removed writer stays removed
    writer.heartbeat()
    assert list(ledger.iterdir()) == []


def test_two_writers_in_one_process_do_not_collide(tmp_path: Path) -> None:
    a, b = _writer(tmp_path), _writer(tmp_path)
    a.set_mib(100)
    b.set_mib(200)
    assert a.path != b.path
    assert read_ledger(tmp_path, now=_now()) == {0: 300}


def test_two_processes_on_one_gpu_are_summed(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    mine = _writer(tmp_path, gpus=(0,))
    mine.set_mib(1000)
    assert read_ledger(tmp_path, now=_now()) == {0: 1700}
    entries = ledger_entries(tmp_path, now=_now())
    assert sorted((e.pid, e.mib, e.model) for e in entries) == sorted(
        [(os.getpid(), 1000, "m"), (child.pid, 700, "child")]
    )
    assert child.stdin is not None
    child.stdin.close()  # clean exit: the child removes its entry
    assert child.wait(timeout=10) == 0
    assert read_ledger(tmp_path, now=_now()) == {0: 1000}


def test_sigkilled_process_is_ignored_though_its_file_stays(
    tmp_path: Path, child: subprocess.Popen[str]
) -> None:
    assert read_ledger(tmp_path, now=_now()) == {0: 700}
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert read_ledger(tmp_path, now=_now()) == {}


def test_unreaped_zombie_is_ignored(tmp_path: Path, child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    # Not reaped yet: os.kill(pid, 0) still succeeds on the zombie.
    stat = Path(f"/proc/{child.pid}/stat")
    until_sync(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", what="a zombie")
    os.kill(child.pid, 0)
    assert read_ledger(tmp_path, now=_now()) == {}


def test_entry_counts_on_each_of_its_gpus(tmp_path: Path) -> None:
    _writer(tmp_path, gpus=(0, 1)).set_mib(500)
    _writer(tmp_path, gpus=(1,)).set_mib(300)
    _writer(tmp_path, gpus=(3, 3)).set_mib(40)  # a repeated index counts once
    assert read_ledger(tmp_path, now=_now()) == {0: 500, 1: 800, 3: 40}


def test_stale_heartbeat_is_ignored(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.set_mib(800)
    [entry] = ledger_entries(tmp_path, now=_now())
    written = entry.updated_at
    assert read_ledger(tmp_path, now=written + 4.9) == {0: 800}
    assert read_ledger(tmp_path, now=written + 5.1) == {}
    assert read_ledger(tmp_path, now=written + 5.1, stale_after_s=10) == {0: 800}
    # a heartbeat makes it fresh again
    deadline = time.monotonic() + 5
    while True:
        writer.heartbeat()
        [entry] = ledger_entries(tmp_path, now=_now())
        if entry.updated_at > written:
            break
        assert time.monotonic() < deadline
    assert entry.mib == 800
    assert read_ledger(tmp_path, now=entry.updated_at + 4.9) == {0: 800}


def test_dead_pid_is_ignored(tmp_path: Path) -> None:
    dead = _exited_pid()
    with pytest.raises(ProcessLookupError):
        os.kill(dead, 0)
    _writer(tmp_path, pid=dead).set_mib(900)
    _writer(tmp_path).set_mib(100)
    assert read_ledger(tmp_path, now=_now()) == {0: 100}
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_pid_from_another_namespace_is_left_to_the_heartbeat(tmp_path: Path) -> None:
    dead = _exited_pid()
    now = _now()
    entry = {
        "pid": dead, "gpus": [0], "mib": 600, "model": "in-a-container", "port": None,
        "updated_at": now, "pid_ns": "pid:[1]",
    }  # fmt: skip
    (tmp_path / "1-abc.json").write_text(json.dumps(entry))
    assert read_ledger(tmp_path, now=now) == {0: 600}
    assert read_ledger(tmp_path, now=now + 6) == {}
    # without a namespace the pid is checked
    (tmp_path / "1-abc.json").write_text(json.dumps({**entry, "pid_ns": None}))
    assert read_ledger(tmp_path, now=now) == {}


def test_other_users_process_counts_as_alive(tmp_path: Path) -> None:
    _writer(tmp_path, pid=1).set_mib(10)  # init: alive, perhaps not ours to signal
    assert read_ledger(tmp_path, now=_now()) == {0: 10}


def test_malformed_files_are_ignored(tmp_path: Path) -> None:
    now = _now()
    good = {
        "pid": os.getpid(), "gpus": [0], "mib": 250, "model": "m", "port": 1,
        "updated_at": now,
    }  # fmt: skip
    bad: dict[str, bytes] = {
        "empty.json": b"",
        "partial.json": json.dumps(good).encode()[:20],
        "list.json": b"[1, 2]",
        "binary.json": b"\xff\xfe\x00garbage",
        "pid-str.json": json.dumps({**good, "pid": "1"}).encode(),
        "pid-bool.json": json.dumps({**good, "pid": True}).encode(),
        "pid-zero.json": json.dumps({**good, "pid": 0}).encode(),
        "mib-negative.json": json.dumps({**good, "mib": -5}).encode(),
        "mib-float.json": json.dumps({**good, "mib": 1.5}).encode(),
        "gpus-empty.json": json.dumps({**good, "gpus": []}).encode(),
        "gpus-int.json": json.dumps({**good, "gpus": 0}).encode(),
        "gpus-negative.json": json.dumps({**good, "gpus": [-1]}).encode(),
        "model-missing.json": json.dumps({k: v for k, v in good.items() if k != "model"}).encode(),
        "port-str.json": json.dumps({**good, "port": "80"}).encode(),
        "updated-null.json": json.dumps({**good, "updated_at": None}).encode(),
        "updated-nan.json": b'{"pid":1,"gpus":[0],"mib":5,"model":"m","port":1,"updated_at":NaN}',
        "ns-int.json": json.dumps({**good, "pid_ns": 5}).encode(),
    }
    for name, raw in bad.items():
        (tmp_path / name).write_bytes(raw)
    (tmp_path / "a-directory.json").mkdir()
    (tmp_path / f".{os.getpid()}-x.json.1234.tmp").write_bytes(json.dumps(good).encode())
    (tmp_path / "notes.txt").write_bytes(json.dumps(good).encode())
    (tmp_path / "good.json").write_bytes(json.dumps(good).encode())
    assert read_ledger(tmp_path, now=now) == {0: 250}
    assert [e.model for e in ledger_entries(tmp_path, now=now)] == ["m"]


def test_missing_directory_is_empty(tmp_path: Path) -> None:
    assert read_ledger(tmp_path / "nope", now=_now()) == {}
    assert ledger_entries(tmp_path / "nope", now=_now()) == []
    (tmp_path / "file").write_text("x")
    assert read_ledger(tmp_path / "file", now=_now()) == {}


def test_writer_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gpus"):
        LedgerWriter(tmp_path, pid=1, gpus=[], model="m", port=None)
    with pytest.raises(ValueError, match="pid"):
        LedgerWriter(tmp_path, pid=0, gpus=[0], model="m", port=None)
    with pytest.raises(ValueError, match="mib"):
        _writer(tmp_path).set_mib(-1)

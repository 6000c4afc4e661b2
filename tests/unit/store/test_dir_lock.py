"""The state directory's lock: one holder, who it is said in the refusal, freed with the
holder's process (even by SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import dir_lock
from app.store.dir_lock import StateDirBusy


def test_a_second_holder_is_refused_with_who_holds_it(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    first = dir_lock.take(directory, host="127.0.0.1", port=8080)
    assert (directory.stat().st_mode & 0o777) == 0o700
    assert (first.path.stat().st_mode & 0o777) == 0o600
    with pytest.raises(StateDirBusy) as info:
        dir_lock.take(directory, host="127.0.0.1", port=8081)
    message = str(info.value)
    assert f"the state directory {directory} is in use by another gateway" in message
    assert f"(pid {os.getpid()}, listening on 127.0.0.1:8080, since " in message
    assert "MICROSCHEDULER_STATE_DIR" in message
    first.release()
    second = dir_lock.take(directory, host="127.0.0.1", port=8081)
    second.release()


def test_an_unreadable_holder_record_still_refuses(tmp_path: Path) -> None:
    held = dir_lock.take(tmp_path, host="127.0.0.1", port=1)
    os.pwrite(held.fd, b"\x00garbage", 0)
    with pytest.raises(StateDirBusy, match="in use by another gateway: two gateways"):
        dir_lock.take(tmp_path, host="127.0.0.1", port=2)
    held.release()


def test_the_lock_dies_with_its_process_even_by_sigkill(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from app.store import dir_lock; "
        "dir_lock.take(Path(sys.argv[1]), host='127.0.0.1', port=9); "
        "print('held', flush=True); time.sleep(60)"
    )
    root = Path(__file__).resolve().parents[3]
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=root, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"held\n"
        with pytest.raises(StateDirBusy, match=f"pid {child.pid}, listening on 127.0.0.1:9"):
            dir_lock.take(tmp_path, host="127.0.0.1", port=10)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    dir_lock.take(tmp_path, host="127.0.0.1", port=10).release()

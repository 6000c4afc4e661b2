"""The relay as a real process (`python -m app.runtimes.output_relay`): a flood on its
stdin leaves two files within the cap, mode 0600, the drops noted in them; it shrugs off
SIGTERM and ends when its input does; it reads its input to the end even when it cannot
write. And a server whose output file cannot be written is not launched."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtimes.base import RuntimeFailure
from app.runtimes.process import PACKAGE_ROOT, ProcessRuntime, relay_command
from app.runtimes.process_record import MemoryBook
from app.settings import ProcessRuntimeConfig
from tests.fakes.waits import until_sync

CAP = 30_000  # under the burst: it rotates at least once
NOTE = re.compile(r"^\[microscheduler\] dropped (\d+) lines \((\d+) bytes\) in the last ", re.M)


def start(path: Path, *limits: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*relay_command(path, cap=CAP), *limits], stdin=subprocess.PIPE, cwd=PACKAGE_ROOT
    )


def test_a_flood_stays_within_the_cap_and_its_drops_are_noted(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    relay = start(path, "--bytes-per-s", "20000", "--burst-bytes", "50000")
    assert relay.stdin is not None
    line = b"%08d " + b"p" * 90 + b"\n"  # 100 bytes
    sent = 0
    for block in range(300):  # 30 MB, as fast as the pipe takes it
        relay.stdin.write(b"".join(line % (block * 1000 + i) for i in range(1000)))
        sent += 1000
    relay.stdin.close()
    assert relay.wait(30) == 0  # its input ended: so does it
    rotated = path.with_name("b.log.1")
    for file in (path, rotated):
        assert file.stat().st_size <= CAP
        assert file.stat().st_mode & 0o777 == 0o600
    text = rotated.read_text() + path.read_text()
    kept = [x for x in text.splitlines() if not NOTE.match(x)]
    assert all(len(x) == 99 for x in kept)  # whole lines, never a piece of one
    dropped = sum(int(m[1]) for m in NOTE.finditer(text))
    assert dropped > sent * 0.9  # 30 MB at 20 kB/s with a 50 kB burst: nearly all
    assert "the server wrote faster than 0.0190735 MiB/s or 10000 lines/s" in text
    assert dropped + len(kept) <= sent  # (the first file's lines went with the rotation)


def test_sigterm_is_ignored_and_the_end_of_input_ends_it(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    relay = start(path)
    assert relay.stdin is not None
    relay.stdin.write(b"before\n")
    relay.stdin.flush()
    # Written: it runs its loop (its handlers are set before it reads).
    until_sync(lambda: path.exists() and path.read_text() == "before\n", timeout_s=10)
    relay.send_signal(signal.SIGTERM)  # as a server's whole group would get at a stop
    relay.send_signal(signal.SIGHUP)
    relay.stdin.write(b"last words\n")
    relay.stdin.close()
    assert relay.wait(10) == 0
    assert path.read_text() == "before\nlast words\n"


def test_an_earlier_runs_output_stays_before_the_new(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_text("earlier run\n")
    done = subprocess.run(
        relay_command(path, cap=CAP), input=b"new run\n", cwd=PACKAGE_ROOT, timeout=10, check=False
    )
    assert done.returncode == 0
    assert path.read_text() == "earlier run\nnew run\n"
    assert sys.executable == relay_command(path)[0]  # the gateway's own interpreter


def test_a_relay_that_cannot_write_its_file_still_reads_the_server_to_the_end(
    tmp_path: Path,
) -> None:
    relay = start(tmp_path / "missing" / "b.log")  # no such directory
    assert relay.stdin is not None
    for _ in range(2000):  # 2 MB: more than a pipe holds, so it must be read
        relay.stdin.write(b"y" * 1023 + b"\n")  # would raise BrokenPipeError unread
    relay.stdin.close()
    assert relay.wait(10) == 1


async def test_a_server_whose_output_cannot_be_written_is_not_launched(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    config = ProcessRuntimeConfig(kind="process", command=["{python}", "-c", "pass"])
    book = MemoryBook()
    runtime = ProcessRuntime(
        "b", config, env={}, book=book, launch="h", output_dir=tmp_path / "file" / "logs"
    )
    with pytest.raises(RuntimeFailure, match="cannot open its output file"):
        await runtime.start()
    assert runtime.pid is None
    assert book.records() == {}

"""The gateway's side of a process backend's output: `OutputFile` reads at most
`READ_BYTES` at a time, skips ahead (and counts it) when far behind, follows the relay's
rotation, counts the relay's notes; `LineSplitter` and `OutputRing` stay bounded."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from app.runtimes.output import (
    BEHIND_BYTES,
    FOLLOW_BATCH,
    MAX_LINE,
    READ_BYTES,
    LineSplitter,
    OutputFile,
    OutputRing,
)

LINE = b"x" * 99 + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as out:
        out.write(data)


def test_a_file_far_behind_is_read_a_bounded_amount_and_the_skip_counted(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(b"")
    output = OutputFile(path)
    assert output.read().lines == []
    append(path, LINE * (12 * 1024 * 1024 // len(LINE)))  # 12 MiB since the last read
    size = path.stat().st_size
    got = output.read()
    assert sum(map(len, got.lines)) <= READ_BYTES
    assert got.lines
    assert all(line == LINE.decode() for line in got.lines)  # whole lines only
    assert got.skipped_bytes == size - READ_BYTES
    append(path, b"after\n")
    assert output.read().lines == ["after\n"]  # on from where it stopped: the end


def test_a_file_a_little_behind_is_read_in_bounded_steps_without_a_skip(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(b"")
    output = OutputFile(path)
    output.read()
    count = (BEHIND_BYTES - 1) // len(LINE)
    append(path, LINE * count)
    seen = 0
    for _ in range(BEHIND_BYTES // READ_BYTES + 1):
        got = output.read()
        assert got.skipped_bytes == 0
        assert sum(map(len, got.lines)) <= READ_BYTES + len(LINE)  # + the last read's rest
        seen += len(got.lines)
    assert seen == count


def test_a_rotation_is_followed_the_old_files_rest_first(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(b"one\n")
    output = OutputFile(path)
    assert output.read().lines == ["one\n"]
    append(path, b"two\nthr")  # then the relay rotates mid-line, and goes on in a new file
    os.replace(path, tmp_path / "b.log.1")
    path.write_bytes(b"ee\nfour\n")
    assert output.read().lines == ["two\n", "three\n", "four\n"]
    append(path, b"five\n")
    assert output.read().lines == ["five\n"]


def test_the_relays_notes_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(b"")
    output = OutputFile(path)
    output.read()
    append(path, b"a\n[microscheduler] dropped 1200 lines (240000 bytes) in the last 1.0 s: "
                 b"the server wrote faster than 1 MiB/s or 10000 lines/s\nb\n")  # fmt: skip
    got = output.read()
    assert got.dropped_lines == 1200
    assert len(got.lines) == 3  # the note stays in the output, for whoever reads it


def test_an_uncapped_file_is_emptied_not_copied(tmp_path: Path) -> None:
    """A server started by a gateway before the relay writes to the file itself: past the
    cap the reader empties it (the writer's append-mode writes land at its start)."""
    path = tmp_path / "b.log"
    path.write_bytes(b"")
    output = OutputFile(path, max_bytes=1000)
    output.read()
    append(path, LINE * 20)  # 2,000 bytes
    got = output.read()
    assert got.skipped_bytes == 2000
    assert path.stat().st_size == 0
    assert not (tmp_path / "b.log.1").exists()
    append(path, b"on\n")
    assert output.read().lines == ["on\n"]


def test_a_first_start_reads_the_end_of_an_old_file_only(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(LINE * 10_000 + b"last\n")  # 1 MB of an earlier gateway's runs
    output = OutputFile(path)
    earlier = output.earlier_lines()
    assert earlier[-1] == "last\n"
    assert sum(map(len, earlier)) <= 256 * 1024
    append(path, b"new\n")
    assert output.read().lines == ["new\n"]


def test_the_splitter_cuts_long_lines_ended_or_not() -> None:
    splitter = LineSplitter()
    long = "y" * (2 * MAX_LINE + 5)
    lines = splitter.feed((long + "\r\nshort\n" + long).encode())
    assert lines[:4] == [
        "y" * MAX_LINE + "\n", "y" * MAX_LINE + "\n", "yyyyy\r\n", "short\n"
    ]  # fmt: skip
    assert lines[4:] == ["y" * MAX_LINE + "\n"] * 2
    assert splitter.flush() == ["yyyyy\n"]


def test_the_splitter_keeps_tqdm_updates_and_crlf_across_cuts() -> None:
    stream = b"\rbar 1\rbar 2\rbar 3\nline\r\nend\n"
    for size in (1, 2, 3, 7, len(stream)):
        splitter = LineSplitter()
        lines = []
        for i in range(0, len(stream), size):
            lines += splitter.feed(stream[i : i + size])
        assert lines == ["bar 1\r", "bar 2\r", "bar 3\n", "line\r\n", "end\n"], size


def test_the_ring_holds_a_bounded_number_of_characters() -> None:
    ring = OutputRing(capacity=100, max_chars=1000)
    ring.extend(["z" * 99 + "\n"] * 30)
    assert len(ring.tail(100)) == 10
    ring.extend(["short\n"] * 5)
    assert ring.tail(100)[-5:] == ["short\n"] * 5
    assert sum(map(len, ring.tail(100))) <= 1000


async def test_a_follower_of_a_big_read_lets_the_loop_run_others_meanwhile() -> None:
    """A 1 MiB read is thousands of lines; the load tracker's work on each must not hold the
    loop (and `/health`) for the whole batch."""
    ring = OutputRing()
    ring.begin_run()
    ring.extend(["line\n"] * 5000)
    other_ran = asyncio.Event()
    other = asyncio.create_task(asyncio.sleep(0, result=None))
    other.add_done_callback(lambda _: other_ran.set())
    seen_at: int | None = None
    count = 0
    async for _ in ring.run_output():
        count += 1
        if seen_at is None and other_ran.is_set():
            seen_at = count
        if count == 5000:
            break
    assert seen_at is not None  # the old follower handed out all 5,000 first
    assert seen_at <= 3 * FOLLOW_BATCH + 1  # the task's step, its end, its callback

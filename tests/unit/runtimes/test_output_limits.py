"""What of a server's output the relay keeps (`OutputGate`: a budget of bytes and lines a
second, whole lines dropped above it, a note in the output saying so) and where a capped
file is cut (`cap_split`). Pure: the time is passed in."""

from __future__ import annotations

import re

from app.runtimes.output_limits import (
    NOTE_EVERY_S,
    Limits,
    OutputGate,
    cap_split,
    dropped_in,
)

LIMITS = Limits(bytes_per_s=1000, lines_per_s=100, burst_bytes=2000, burst_lines=200)
NOTE = re.compile(rb"\[microscheduler\] dropped (\d+) lines \((\d+) bytes\) in the last ")


def lines(n: int, width: int = 10) -> bytes:
    """`n` lines of `width` bytes each, the newline included."""
    return b"".join(b"%0*d\n" % (width - 1, i) for i in range(n))


def notes(out: bytes) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for m in NOTE.finditer(out)]


def server_lines(out: bytes) -> list[bytes]:
    return [line for line in out.splitlines(keepends=True) if not NOTE.match(line)]


def test_output_within_the_budget_passes_untouched_whatever_the_cuts() -> None:
    gate = OutputGate(LIMITS, now=0.0)
    data = lines(150) + b"a bar\rits update\r"
    out = b"".join(gate.feed(data[i : i + 7], now=0.0) for i in range(0, len(data), 7))
    assert out == data
    assert gate.close(now=1.0) == b""


def test_above_the_burst_whole_lines_are_dropped_counted_and_noted() -> None:
    gate = OutputGate(LIMITS, now=0.0)
    flood = lines(1000)  # 10,000 bytes at once: the burst is 2,000 bytes, 200 lines
    out = gate.feed(flood, now=0.0)
    kept = server_lines(out)
    assert kept == flood.splitlines(keepends=True)[:200]  # the first 2,000 bytes, whole lines
    assert notes(out) == []  # the note comes when due, or when the output fits again
    out += gate.due(now=NOTE_EVERY_S - 0.01)
    assert notes(out) == []
    note = gate.due(now=NOTE_EVERY_S)
    assert notes(note) == [(800, 8000)]
    assert note.endswith(b"faster than 0.000953674 MiB/s or 100 lines/s\n")
    assert dropped_in(note.decode()) == (800, 8000)
    assert gate.due(now=NOTE_EVERY_S + 5) == b""  # told once


def test_a_line_cut_by_the_budget_is_ended_and_its_rest_dropped() -> None:
    gate = OutputGate(Limits(1000, 100, 25, 100), now=0.0)
    out = gate.feed(b"0123456789\nabcdefghij", now=0.0)  # 21 bytes: all kept, mid-line
    assert out == b"0123456789\nabcdefghij"
    out = gate.feed(b"klmnopqrstuvwxyz\nnext\n", now=0.0)  # over: the line is cut
    assert out == b"\n"  # the written part ends, a line of its own
    out = gate.feed(b"ABC\n", now=0.02)  # 20 bytes of budget again: the whole line
    assert out.endswith(b"ABC\n")
    assert notes(out) == [(2, 22)]  # "klmnopqrstuvwxyz\n" and "next\n": 22 bytes, 2 lines
    assert out.index(b"[microscheduler]") == 0  # at a line boundary, before what is kept


def test_the_rest_of_a_cut_line_is_dropped_across_reads() -> None:
    gate = OutputGate(Limits(1000, 100, 10, 100), now=0.0)
    assert gate.feed(b"0123456789abcdef", now=0.0) == b""  # longer than the budget
    assert gate.feed(b"ghij", now=0.0) == b""  # still that line
    out = gate.feed(b"klm\nok\n", now=1.0)  # its end, then a line that fits
    assert server_lines(out) == [b"ok\n"]
    assert notes(out) == [(1, 24)]


def test_the_line_budget_holds_for_short_lines() -> None:
    gate = OutputGate(Limits(10**9, 100, 10**9, 50), now=0.0)
    out = gate.feed(b"\n" * 1000, now=0.0)
    assert out == b"\n" * 50
    out = gate.feed(b"x\n" * 10, now=0.1)  # 10 lines of budget again: they fit
    assert server_lines(out)[-10:] == [b"x\n"] * 10
    assert notes(out) == [(950, 950)]


def test_a_sustained_flood_is_noted_once_a_second_and_a_trickle_is_kept() -> None:
    gate = OutputGate(LIMITS, now=0.0)
    flood = lines(100_000 // 10)  # 100 kB a read, 100 times a second: 10 MB/s
    written = b""
    kept_lines = 0
    for tick in range(1, 301):
        now = tick / 100
        out = gate.feed(flood, now) + gate.due(now)
        written += out
        kept_lines += len(server_lines(out))
    written += gate.close(now=3.0)
    told = notes(written)
    assert len(told) == 3  # at 1.01 s and 2.01 s (a second after the first drop), the end
    dropped = sum(n for n, _ in told)
    assert dropped + kept_lines == 300 * 10_000  # every line kept or counted
    # Kept: the burst, then the rate (1,000 bytes a second: 100 lines of 10 bytes).
    assert 200 + 300 - 10 <= kept_lines <= 200 + 300


def test_a_quiet_end_after_drops_says_so() -> None:
    gate = OutputGate(LIMITS, now=0.0)
    gate.feed(lines(500), now=0.0)
    assert gate.wait_s(now=0.25) == NOTE_EVERY_S - 0.25
    assert notes(gate.close(now=0.5)) == [(300, 3000)]
    assert gate.wait_s(now=0.5) is None


def test_other_lines_are_no_notes() -> None:
    assert dropped_in("dropped 5 lines (10 bytes) in the last 1.0 s\n") is None
    assert dropped_in("INFO [microscheduler] dropped everything\n") is None


def test_a_capped_file_is_cut_at_a_line_end_and_rotated_before_the_cap() -> None:
    assert cap_split(0, b"abc\n", cap=10) == 4
    assert cap_split(6, b"abc\n", cap=10) == 4  # exactly full
    assert cap_split(7, b"abc\n", cap=10) == 0  # rotate first
    assert cap_split(2, b"ab\ncdefghij\n", cap=10) == 3  # what fits, to a line's end
    assert cap_split(0, b"0123456789abc\n", cap=10) == 10  # one line longer than the cap
    assert cap_split(50, b"x", cap=10) == 0  # a file past the cap (written before)

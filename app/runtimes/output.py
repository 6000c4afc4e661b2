"""A backend server's output, as the gateway keeps and serves it.

- `LineSplitter` (pure) cuts a byte stream into lines, keeping each line's terminator:
  `\\n`, or `\\r` for the updates of a tqdm bar (weight shards, CUDA graphs), so a reader
  sees each update (the load progress does) and a terminal shows the bar in place. A line
  longer than `MAX_LINE` characters is cut there.
- `OutputRing`: the last `capacity` lines in memory (`max_chars` of them together at
  most), numbered, with followers that wait for new ones. Each run of the server is
  marked (`begin_run`), so a start reads only its
  own lines, and `end_run` ends the followers when the server has exited.
- `OutputFile`: a process backend's output file, as `app.runtimes.output_relay` writes
  it (capped, rotated to `NAME.log.1`, lines above a rate dropped and a note saying so),
  read by polling from a thread, at most `READ_BYTES` at a time: further than
  `BEHIND_BYTES` behind, it skips ahead and counts what it skipped.

`OutputSource` is what a runtime that can show its server's output offers.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Protocol, runtime_checkable

from app.runtimes.output_limits import NOTE_PREFIX, dropped_in

MAX_LINE: Final = 16 * 1024  # characters; a longer line is cut
RING_LINES: Final = 5000
RING_CHARS: Final = 8 * 1024 * 1024  # the ring's lines together, at most
MAX_TAIL: Final = RING_LINES
# A follower is handed this many lines, then the loop runs others (a 1 MiB read is ~5,000
# lines; the load tracker's ~8 us each would hold the loop ~40 ms).
FOLLOW_BATCH: Final = 256
FILE_MAX_BYTES: Final = 16 * 1024 * 1024  # each of `NAME.log` and `NAME.log.1` (the relay's cap)
SEED_BYTES: Final = 256 * 1024  # read back from the file when a server is adopted
READ_BYTES: Final = 1024 * 1024  # read from the file at most at once
BEHIND_BYTES: Final = 8 * READ_BYTES  # further behind: skip to the last READ_BYTES (> the burst)
_BREAK: Final = re.compile(r"\r\n|\n|\r")
_NOTE_TEXT: Final = NOTE_PREFIX.decode()


@runtime_checkable
class OutputSource(Protocol):
    """A runtime whose server's output the gateway can read."""

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        """Opens the output: the last `tail` lines (each with its terminator); with
        `follow`, then the new ones as they come, until the server exits or the caller
        stops reading. Raises `RuntimeFailure` when it cannot be opened (the iterator may
        raise it too, when the source fails later)."""
        ...

    def run_output(self) -> AsyncIterator[str]:
        """The current run's output, from its start as far as it is still known, then as it
        comes, until the server exits (for the load progress and start failures)."""
        ...


class LineSplitter:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> list[str]:
        """The complete lines in `data` (plus what came before), terminators kept; a line
        longer than `MAX_LINE` is cut in pieces of that length (each ended by `\\n`)."""
        text = self._pending + self._decoder.decode(data)
        lines: list[str] = []
        start = 0
        for found in _BREAK.finditer(text):
            end = found.end()
            if found.group() == "\r":
                if end == len(text):
                    break  # a "\r\n" may be cut here: decide with the next chunk
                if found.start() == start:
                    start = end  # tqdm's "\r" before its first bar: nothing to end
                    continue
            if end - start > MAX_LINE:
                lines.extend(_pieces(text[start : found.start()]))
                lines[-1] = lines[-1][:-1] + found.group()
            else:
                lines.append(text[start:end])
            start = end
        rest = text[start:]
        if len(rest) > MAX_LINE:
            cut = (len(rest) - 1) // MAX_LINE * MAX_LINE
            lines.extend(_pieces(rest[:cut]))
            rest = rest[cut:]
        self._pending = rest
        return lines

    def flush(self) -> list[str]:
        """What is left without a terminator (the stream ended), as a last line."""
        rest, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        return [rest + "\n"] if rest else []


def _pieces(text: str) -> list[str]:
    """`text` (no terminator in it) as lines of at most `MAX_LINE` characters."""
    return [text[i : i + MAX_LINE] + "\n" for i in range(0, len(text), MAX_LINE)]


class OutputRing:
    def __init__(self, capacity: int = RING_LINES, max_chars: int = RING_CHARS) -> None:
        self._lines: deque[str] = deque()
        self._capacity = capacity
        self._max_chars = max_chars
        self._chars = 0
        self._next = 0  # the number the next line gets
        self._run_start = 0  # the first line of the current run
        self._running = False
        self._changed = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._running

    def begin_run(self) -> None:
        self._run_start = self._next
        self._running = True
        self._wake()

    def end_run(self) -> None:
        self._running = False
        self._wake()

    def extend(self, lines: list[str]) -> None:
        if lines:
            self._lines.extend(lines)
            self._chars += sum(map(len, lines))
            while len(self._lines) > self._capacity or self._chars > self._max_chars:
                self._chars -= len(self._lines.popleft())
            self._next += len(lines)
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _first(self) -> int:
        return self._next - len(self._lines)

    def _since(self, seq: int) -> list[str]:
        first = self._first()
        return list(self._lines)[max(seq, first) - first :]

    def tail(self, n: int) -> list[str]:
        return list(self._lines)[-n:] if n > 0 else []

    async def follow(self, seq: int) -> AsyncIterator[str]:
        """Lines from number `seq` on (the oldest kept when older), as they come, until
        the run ends."""
        while True:
            lines = self._since(seq)
            seq = self._next
            for index, line in enumerate(lines, 1):
                yield line
                if index % FOLLOW_BATCH == 0:
                    await asyncio.sleep(0)  # a big read's lines: let the loop breathe
            if not self._running:
                return
            changed = self._changed
            if self._next == seq and self._running:
                await changed.wait()

    async def logs(self, tail: int, follow: bool) -> AsyncIterator[str]:
        start = self._next - min(tail, len(self._lines))
        if not follow:
            for line in self._since(start):
                yield line
            return
        async for line in self.follow(start):
            yield line

    def run_output(self) -> AsyncIterator[str]:
        return self.follow(self._run_start)


@dataclass(slots=True)
class OutputRead:
    """What one read of an output file gave."""

    lines: list[str]
    skipped_bytes: int = 0  # not read: the reader was too far behind (or cut a file)
    dropped_lines: int = 0  # the relay dropped, as its notes among `lines` say


class OutputFile:
    """A process backend's output file, read from where the last read ended; a rotation
    (the relay renames it to `NAME.log.1`, then writes a new one) is followed: the rest of
    the old file is read first. Blocking: call it from a thread, one call at a time."""

    def __init__(self, path: Path, *, max_bytes: int = FILE_MAX_BYTES) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._ino: int | None = None  # the file read (None: none yet)
        self._offset = 0  # where the last read ended in it
        self._splitter = LineSplitter()
        self._cut_line = False  # the next line read is a rest (after a skip): drop it

    def skip_to_end(self, *, seed_bytes: int = SEED_BYTES) -> list[str]:
        """Read from the end on (an adopted server, a first start): the last complete
        lines of the file's last `seed_bytes`, for the ring."""
        self._splitter = LineSplitter()
        self._cut_line = False
        try:
            with open(self.path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                start = max(0, stat.st_size - seed_bytes)
                handle.seek(start)
                data = handle.read(stat.st_size - start)
        except OSError:
            return []
        self._ino, self._offset = stat.st_ino, start + len(data)
        lines = self._splitter.feed(data)
        return lines[1:] if start > 0 else lines  # the first one was cut

    def earlier_lines(self) -> list[str]:
        """Before a start: what the file holds that was not read yet (an earlier run's
        end; of a file never read, its last `SEED_BYTES`)."""
        if self._ino is None:
            return self.skip_to_end()
        return self.read_to_end().lines

    def read(self) -> OutputRead:
        """The complete lines written since the last read (at most `READ_BYTES` read; a
        file not read yet is read from its start). Never raises: a file that cannot be
        read gives nothing."""
        got = OutputRead([])
        try:
            with open(self.path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                data = b""
                if stat.st_ino != self._ino:
                    if self._ino is not None:
                        data = self._rest_of_rotated(got)
                    self._ino, self._offset = stat.st_ino, 0
                data += self._read(handle, stat.st_size, got, READ_BYTES - len(data))
        except OSError:
            return got
        got.lines = self._split(data)
        for line in got.lines:
            if line.startswith(_NOTE_TEXT):
                dropped = dropped_in(line)
                got.dropped_lines += dropped[0] if dropped else 0
        return got

    def read_to_end(self, *, at_most: int = 2 * FILE_MAX_BYTES) -> OutputRead:
        """Reads until the file ends (the server exited: nothing more comes), at most
        `at_most` bytes, then what is left of its last line."""
        total = OutputRead([])
        for _ in range(max(1, at_most // READ_BYTES)):
            got = self.read()
            total.lines += got.lines
            total.skipped_bytes += got.skipped_bytes
            total.dropped_lines += got.dropped_lines
            if not got.lines and not got.skipped_bytes:
                break
        total.lines += self._splitter.flush()
        return total

    def _rest_of_rotated(self, got: OutputRead) -> bytes:
        """What was not read yet of the file read so far, now `NAME.log.1` (if it still
        is: rotated twice since the last read, it is gone)."""
        try:
            with open(self.path.with_name(self.path.name + ".1"), "rb") as handle:
                stat = os.fstat(handle.fileno())
                if stat.st_ino != self._ino:
                    return b""
                return self._read(handle, stat.st_size, got, READ_BYTES)
        except OSError:
            return b""

    def _read(self, handle: BinaryIO, size: int, got: OutputRead, limit: int) -> bytes:
        """At most `limit` bytes from where the last read ended; skips ahead when further
        behind than `BEHIND_BYTES`; starts again from 0 in a file cut shorter (by someone
        else). A file past the cap has no relay capping it (a server started by a gateway
        before the relay, adopted): it is emptied, the writer's next write (append mode)
        landing at its start."""
        if size > self._max_bytes and handle.name == str(self.path):
            os.truncate(self.path, 0)
            got.skipped_bytes += size - self._offset
            self._offset = 0
            self._restart(mid_line=False)
            return b""
        if size < self._offset:
            self._offset = 0
            self._restart(mid_line=False)
        if size - self._offset > BEHIND_BYTES:
            got.skipped_bytes += size - READ_BYTES - self._offset
            self._offset = size - READ_BYTES
            self._restart(mid_line=True)
        handle.seek(self._offset)
        data = handle.read(max(0, limit))
        self._offset += len(data)
        return data

    def _restart(self, *, mid_line: bool) -> None:
        """The next bytes are not where the last read ended: a new splitter (whose first
        line, a rest when they start `mid_line`, is dropped)."""
        self._splitter = LineSplitter()
        self._cut_line = mid_line

    def _split(self, data: bytes) -> list[str]:
        lines = self._splitter.feed(data)
        if self._cut_line and lines:
            self._cut_line = False
            return lines[1:]
        return lines

"""A backend server's output, as the gateway keeps and serves it.

- `LineSplitter` (pure) cuts a byte stream into lines, keeping each line's terminator:
  `\\n`, or `\\r` for the updates of a tqdm bar (weight shards, CUDA graphs), so a reader
  sees each update (the load progress does) and a terminal shows the bar in place. A line
  longer than `MAX_LINE` characters is cut there.
- `OutputRing`: the last `capacity` lines in memory, numbered, with followers that wait
  for new ones. Each run of the server is marked (`begin_run`), so a start reads only its
  own lines, and `end_run` ends the followers when the server has exited.
- `OutputFile`: where a process backend writes (the process's stdout and stderr are this
  file, not a pipe to the gateway; see `app.runtimes.process`), read by polling, rotated
  by copy-and-truncate.

`OutputSource` is what a runtime that can show its server's output offers.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import shutil
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

MAX_LINE: Final = 16 * 1024  # characters; a longer line is cut
RING_LINES: Final = 5000
MAX_TAIL: Final = RING_LINES
FILE_MAX_BYTES: Final = 16 * 1024 * 1024  # then copied to `NAME.log.1` and truncated
SEED_BYTES: Final = 256 * 1024  # read back from the file when a server is adopted


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
        """The complete lines in `data` (plus what came before), terminators kept."""
        text = self._pending + self._decoder.decode(data)
        lines: list[str] = []
        start = 0
        for index, char in enumerate(text):
            if char == "\r":
                if index + 1 == len(text):
                    break  # a "\r\n" may be cut here: decide with the next chunk
                if text[index + 1] == "\n":
                    continue  # "\r\n" (a TTY's newline): one line, ended at the "\n"
                if index == start:
                    start = index + 1  # tqdm's "\r" before its first bar: nothing to end
                    continue
            if char == "\n" or char == "\r":
                lines.append(text[start : index + 1])
                start = index + 1
        rest = text[start:]
        while len(rest) > MAX_LINE:
            lines.append(rest[:MAX_LINE] + "\n")
            rest = rest[MAX_LINE:]
        self._pending = rest
        return lines

    def flush(self) -> list[str]:
        """What is left without a terminator (the stream ended), as a last line."""
        rest, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        return [rest + "\n"] if rest else []


class OutputRing:
    def __init__(self, capacity: int = RING_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=capacity)
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
            for line in lines:
                yield line
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


class OutputFile:
    """A process backend's output file, read from where the last read ended."""

    def __init__(self, path: Path, *, max_bytes: int = FILE_MAX_BYTES) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._offset = 0
        self._splitter = LineSplitter()

    def open_for_child(self) -> int:
        """A descriptor the child writes to (append mode: a truncation by the rotation
        moves its next write to the start). The caller closes it after the spawn."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def skip_to_end(self, *, seed_bytes: int = SEED_BYTES) -> list[str]:
        """Read from the end on (an adopted server): the last complete lines of the file's
        last `seed_bytes`, for the ring."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        start = max(0, size - seed_bytes)
        self._offset = start
        self._splitter = LineSplitter()
        lines = self.read()
        return lines[1:] if start > 0 else lines  # the first one was cut

    def read(self) -> list[str]:
        """The complete lines written since the last read; rotates a file grown past
        `max_bytes`. Never raises: a file that cannot be read gives nothing."""
        try:
            with open(self.path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self._offset:  # truncated (rotated): from the start again
                    self._offset = 0
                handle.seek(self._offset)
                data = handle.read(size - self._offset)
        except OSError:
            return []
        self._offset += len(data)
        lines = self._splitter.feed(data)
        if self._offset > self._max_bytes:
            self._rotate()
        return lines

    def flush(self) -> list[str]:
        return self._splitter.flush()

    def _rotate(self) -> None:
        """Copy to `NAME.log.1` and truncate: the child keeps its descriptor (append mode),
        so renaming would leave it writing to the old file."""
        try:
            shutil.copyfile(self.path, self.path.with_name(self.path.name + ".1"))
            os.truncate(self.path, 0)
        except OSError:
            return
        self._offset = 0

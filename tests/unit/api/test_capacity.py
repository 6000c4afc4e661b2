"""The connection cap's size: from the file limit (raised soft to hard) unless configured,
and the warnings for a low limit or a cap the limit cannot hold. No loop, no real limit."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from app.api.capacity import (
    FDS_RESERVED,
    FileLimit,
    connection_cap,
    current_file_limit,
    listen_backlog,
    raise_file_limit,
    sized,
)


class Limits:
    """A process's RLIMIT_NOFILE, settable like the kernel's (soft at most hard; `ceiling`
    is `fs.nr_open`: more is refused with EPERM)."""

    def __init__(self, soft: int, hard: int, ceiling: int = 1 << 20) -> None:
        self.soft, self.hard, self.ceiling = soft, hard, ceiling
        self.calls: list[tuple[int, int]] = []

    def get(self) -> tuple[int, int]:
        return self.soft, self.hard

    def set(self, limits: tuple[int, int]) -> None:
        self.calls.append(limits)
        soft, hard = limits
        if soft > self.ceiling or (hard != resource.RLIM_INFINITY and soft > hard):
            raise PermissionError(1, "Operation not permitted")
        self.soft, self.hard = soft, hard


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    limits = Limits(1024, 65536)
    files = raise_file_limit(limits.get, limits.set)
    assert files == FileLimit(soft=65536, hard=65536, before=1024)
    assert files.raised
    assert limits.calls == [(65536, 65536)]


def test_a_soft_limit_at_the_hard_one_is_left_alone() -> None:
    limits = Limits(20000, 20000)
    files = raise_file_limit(limits.get, limits.set)
    assert files == FileLimit(soft=20000, hard=20000, before=20000)
    assert not files.raised
    assert limits.calls == []


def test_an_unlimited_hard_limit_raises_to_the_kernels_ceiling() -> None:
    limits = Limits(1024, resource.RLIM_INFINITY)
    files = raise_file_limit(limits.get, limits.set)
    assert (files.soft, files.hard, files.before) == (1 << 20, 1 << 20, 1024)
    assert limits.calls == [(1 << 20, resource.RLIM_INFINITY)]


def test_a_refused_raise_keeps_the_limit_it_had() -> None:
    limits = Limits(1024, 1 << 21)  # above fs.nr_open: the kernel says EPERM
    files = raise_file_limit(limits.get, limits.set)
    assert (files.soft, files.before, files.raised) == (1024, 1024, False)
    assert limits.calls == [(1 << 21, 1 << 21)]


def test_check_config_sees_the_limit_serve_would_raise_to() -> None:
    limits = Limits(1024, 65536)
    assert current_file_limit(limits.get) == FileLimit(soft=65536, hard=65536, before=1024)
    assert limits.calls == []  # its own limit is not changed


@pytest.mark.parametrize(
    ("soft", "cap"),
    [(20_000, 9_488), (1 << 20, 523_776), (65_536, 32_256), (2_048, 512), (1_024, 16), (100, 16)],
)
def test_the_cap_is_two_files_a_stream_after_the_reserve(soft: int, cap: int) -> None:
    assert sized(soft) == cap
    assert cap == max(16, (soft - FDS_RESERVED) // 2)


def test_a_default_cap_over_4096_streams_says_nothing() -> None:
    cap = connection_cap(None, FileLimit(soft=20_000, hard=20_000, before=1_024))
    assert (cap.limit, cap.configured, cap.source) == (9_488, False, "file limit")
    assert cap.warning() is None
    assert cap.describe() == (
        "at most 9,488 connections at once (file limit 20,000, raised from 1,024: "
        "2 files a stream, 1,024 kept for the gateway)"
    )


def test_a_low_file_limit_warns_with_what_to_raise() -> None:
    cap = connection_cap(None, FileLimit(soft=4_096, hard=4_096, before=1_024))
    assert cap.limit == 1_536
    warning = cap.warning()
    assert warning is not None
    assert "allows only 1,536 concurrent connections" in warning
    assert "ulimit -Hn" in warning
    assert "--ulimit nofile" in warning
    assert "at least 9,216" in warning  # 4,096 streams, two files each, and the reserve


def test_a_configured_cap_wins_and_warns_only_when_the_limit_cannot_hold_it() -> None:
    files = FileLimit(soft=20_000, hard=20_000, before=20_000)
    fits = connection_cap(500, files)
    assert (fits.limit, fits.source, fits.warning()) == (500, "max_connections", None)
    assert fits.describe() == (
        "at most 500 connections at once (server.max_connections; file limit 20,000)"
    )
    too_many = connection_cap(50_000, files)
    warning = too_many.warning()
    assert warning is not None
    assert "max_connections 50,000 needs about 101,024 open files" in warning
    assert "Lower max_connections to 9,488" in warning


def test_the_listen_queue_is_what_the_kernel_gives(tmp_path: Path) -> None:
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("4096\n")
    assert listen_backlog(65535, str(somaxconn)) == 4096  # listen(2) truncates it there
    assert listen_backlog(128, str(somaxconn)) == 128
    assert listen_backlog(65535, str(tmp_path / "absent")) is None  # not Linux: unknown

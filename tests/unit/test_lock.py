"""The locked build, checked on the files: requirements.lock pins every runtime dependency
(transitive ones and the build backend included) with `==` and sha256 hashes, within
pyproject.toml's ranges, whose floors and exclusions keep known-bad releases out; the
Dockerfile installs from it with `--require-hashes` and the project with `--no-deps`.

Offline: a dependency's own requirements are read from the installed distribution when
its version is the locked one (the dev install resolves the same ranges, so it usually
is); a package installed at another version is not descended into."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# The image's interpreter and platform (Dockerfile: python:3.11-slim; Makefile: LOCK_PYTHON).
TARGET: Mapping[str, str] = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
SHA256 = re.compile(r"--hash=sha256:[0-9a-f]{64}")
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: int


def logical_lines(text: str) -> list[str]:
    """The lines of a requirements file, comments dropped, `\\` continuations joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line.split("#", 1)[0] for line in text.splitlines()))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def parse_lock(text: str) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    for line in logical_lines(text):
        match = PIN.match(line)
        assert match, f"not an exact pin: {line[:80]}"
        rest = line[match.end() :].split()
        hashes = [word for word in rest if SHA256.fullmatch(word)]
        assert hashes, f"{match[1]}=={match[2]} has no sha256 hash"
        assert len(hashes) == len(rest), f"{match[1]}: only sha256 hashes may follow a pin"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{name} is pinned twice"
        pins[name] = Pin(Version(match[2]), len(hashes))
    return pins


def applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(
        marker.evaluate({**TARGET, "extra": extra}) for extra in ("", *extras)
    )


def installed_requirements(name: str, version: Version) -> list[Requirement] | None:
    """The requirements of `name` as installed here, or None if its installed version differs."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if Version(dist.version) != version:
        return None
    return [Requirement(text) for text in dist.requires or []]


def unmet(roots: Iterable[Requirement], pins: Mapping[str, Pin]) -> tuple[list[str], set[str]]:
    """What the lock misses or pins outside a range, walking the requirements from `roots`;
    and the packages whose requirements were read."""
    problems: list[str] = []
    read: set[str] = set()
    queue = [(requirement, "pyproject.toml") for requirement in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        requirement, needed_by = queue.pop()
        name = canonicalize_name(requirement.name)
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{name} ({needed_by} needs {requirement}) is not in the lock")
            continue
        if not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{name}=={pin.version} is outside {needed_by}'s {requirement}")
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        requirements = installed_requirements(name, pin.version)
        if requirements is None:
            continue
        read.add(name)
        queue.extend(
            (dep, f"{name} {pin.version}")
            for dep in requirements
            if applies(dep, requirement.extras)
        )
    return problems, read


PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
RUNTIME = [Requirement(text) for text in PYPROJECT["project"]["dependencies"]]
BUILD = [Requirement(text) for text in PYPROJECT["build-system"]["requires"]]


@pytest.fixture(scope="module")
def pins() -> dict[str, Pin]:
    return parse_lock(LOCK.read_text(encoding="utf-8"))


def test_the_lock_parser_refuses_loose_or_unhashed_lines() -> None:
    good = "--hash=sha256:" + "a" * 64
    assert parse_lock(f"a==1.0 \\\n    {good}\n    # via b\n") == {"a": Pin(Version("1.0"), 1)}
    for bad in (f"a>=1.0 {good}", "a==1.0", f"a==1.0 --hash=md5:{'a' * 32}", f"-e . {good}"):
        with pytest.raises(AssertionError):
            parse_lock(bad)


def test_the_walk_finds_a_missing_and_an_out_of_range_dependency() -> None:
    # pytest's own requirements are installed here: the walk reads them.
    pytest_version = Version(importlib.metadata.version("pytest"))
    pins = {"pytest": Pin(pytest_version, 1), "pluggy": Pin(Version("0.1"), 1)}
    problems, read = unmet([Requirement("pytest")], pins)
    assert read == {"pytest"}
    assert any(p.startswith("pluggy==0.1 is outside pytest") for p in problems)
    assert any(p.startswith("iniconfig (pytest") for p in problems)


def test_every_line_is_an_exact_pin_with_hashes() -> None:
    pins = parse_lock(LOCK.read_text(encoding="utf-8"))  # asserts each line's form
    assert len(pins) > len(RUNTIME)
    assert all(pin.hashes >= 1 for pin in pins.values())


def test_the_lock_holds_every_runtime_dependency_and_theirs(pins: dict[str, Pin]) -> None:
    problems, read = unmet([*RUNTIME, *BUILD], pins)
    assert problems == []
    assert read  # the walk went past the direct dependencies


@pytest.mark.parametrize(
    ("name", "floor", "refused"),
    [
        ("aiohttp", "3.14.3", ["3.14.2"]),  # CVEs through 3.14.2
        ("starlette", "1.3.1", ["1.3.0"]),  # a CVE before 1.3.1
        # uvicorn PR #2829 (in 0.43.0 and 0.44.0, reverted in 0.45.0): a shutdown sends
        # http.disconnect to streaming responses, cutting every SSE stream at once.
        ("uvicorn", "0", ["0.43.0", "0.44.0"]),
    ],
)
def test_the_floors_and_exclusions_hold(
    pins: dict[str, Pin], name: str, floor: str, refused: list[str]
) -> None:
    (declared,) = [r for r in RUNTIME if canonicalize_name(r.name) == name]
    for version in refused:
        assert not declared.specifier.contains(version), f"pyproject.toml admits {name} {version}"
    pinned = pins[name].version
    assert pinned >= Version(floor)
    assert str(pinned) not in refused
    assert pinned in declared.specifier


def test_the_image_installs_only_what_the_lock_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    instructions = re.sub(r"\\\n", " ", dockerfile).splitlines()
    installs = [line for line in instructions if "pip install" in line]
    assert any(
        "--require-hashes" in line and "-r requirements.lock" in line for line in installs
    ), installs
    assert "COPY requirements.lock" in dockerfile
    for line in installs:
        locked = "--require-hashes" in line and "-r requirements.lock" in line
        # The project itself: nothing resolved, nothing fetched for its build.
        assert locked or ("--no-deps" in line and "--no-build-isolation" in line), line

"""The documentation as tests read it: a page of docs/ by name, a section of it by heading.

Examples in the docs that are run as tests (the planner's outputs, the error table) are
read from here, so a page can move or grow without the tests losing them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HEADING = re.compile(r"(#{1,6}) (.+)")
INCLUDE = re.compile(r'--8<-- "([^":]+)(?::([\w-]+))?"')


def included(path: str, part: str | None) -> str:
    """A file a page includes (`--8<-- "PATH"`, relative to the repository), or the part
    of it between its `--8<-- [start:PART]` and `--8<-- [end:PART]` lines."""
    text = (ROOT / path).read_text(encoding="utf-8")
    if part is None:
        return text
    start, end = f"--8<-- [start:{part}]", f"--8<-- [end:{part}]"
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next(i for i, line in enumerate(lines) if end in line)
    return "\n".join(lines[first + 1 : last]) + "\n"


def expand(text: str) -> str:
    """TEXT with each include line replaced by what it includes, as MkDocs renders it."""
    return "\n".join(
        expand(included(m.group(1), m.group(2))) if (m := INCLUDE.fullmatch(line.strip())) else line
        for line in text.splitlines()
    )


def page(name: str) -> str:
    """The Markdown of docs/NAME.md, its includes expanded."""
    return expand((DOCS / f"{name}.md").read_text(encoding="utf-8"))


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each heading outside fenced code blocks."""
    found: list[tuple[int, int, str]] = []
    fence = False
    for index, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        match = None if fence else HEADING.fullmatch(line)
        if match:
            found.append((index, len(match.group(1)), match.group(2).strip()))
    return found


def section(text: str, title: str) -> str:
    """The lines under the heading TITLE, up to the next heading of its level or above."""
    lines = text.splitlines()
    marks = headings(text)
    for position, (index, level, name) in enumerate(marks):
        if name == title:
            end = next((i for i, lv, _ in marks[position + 1 :] if lv <= level), len(lines))
            return "\n".join(lines[index + 1 : end]) + "\n"
    raise LookupError(f"no heading {title!r}")

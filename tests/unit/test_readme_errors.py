"""The README's error table lists every code the gateway writes, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from app.errors import ErrorCode

README = Path(__file__).resolve().parents[2] / "README.md"


def table_codes() -> set[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Errors", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    codes: set[str] = set()
    for row in rows:
        last = row.rstrip(" |").rsplit("|", 1)[-1]
        codes.update(re.findall(r"`([a-z_0-9]+)`", last))
    return codes


def test_the_table_is_read() -> None:
    assert {"invalid_json", "backend_yielded", "fallback_deadline"} <= table_codes()


def test_every_error_code_is_in_the_readme_table() -> None:
    codes = {code.value for code in ErrorCode}
    assert sorted(codes - table_codes()) == [], "codes the README's table does not list"
    assert sorted(table_codes() - codes) == [], (
        "codes in the README's table the gateway never writes"
    )

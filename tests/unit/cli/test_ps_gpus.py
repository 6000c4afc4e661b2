"""`microscheduler ps` and `status` say which GPUs each backend holds now, and `status`
why a backend placed at each start went there (issue 37: placement seen everywhere)."""

from __future__ import annotations

import re
from typing import Any

from app.cli.backends import render_ps
from app.cli.status import render


def backend(name: str, gpus: list[int], placement: Any, why: str, **fields: Any) -> Any:
    return {
        "name": name, "state": "ready", "lifecycle": "lazy", "held_mib": 14000,
        "in_flight": 0, "waiting": 0, "idle_stop_in_s": None, "idle": None,
        "gpus": gpus, "last_gpus": gpus or None, "placement": placement, "placed_why": why,
        **fields,
    }  # fmt: skip


BACKENDS = [
    backend("big", [0, 1], 2, "GPU 0, 1: 24.0 and 24.0 GiB free, spread"),
    backend("small", [1], "auto", "GPU 1: 18.2 GiB free, pack"),
    backend("fixed", [0], [0], "gpus: in its config"),
    backend("off", [], "auto", "not placed yet", state="stopped", held_mib=None),
]


def cells(line: str) -> list[str]:
    return line.split()


def test_ps_has_a_gpus_column() -> None:
    lines = render_ps(BACKENDS).splitlines()
    assert cells(lines[0])[:4] == ["backend", "state", "lifecycle", "GPUs"]
    assert [cells(line)[3] for line in lines[1:]] == ["0,1", "1", "0", "-"]


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_status_shows_the_gpus_and_why_a_backend_chosen_at_each_start_went_there() -> None:
    text = render({"backends": BACKENDS, "gpu": {}, "holds": {}}, "http://gw")
    rows = {cells(line)[0]: line for line in text.splitlines() if line}
    assert "GPUs" in cells(rows["backend"])
    last = {name: columns(line)[-3:] for name, line in rows.items()}
    assert last["backend"] == ["GPUs", "VRAM MiB", "why"]
    assert last["small"] == ["1", "14,000", "placed GPU 1: 18.2 GiB free, pack"]
    assert last["big"] == ["0,1", "14,000", "placed GPU 0, 1: 24.0 and 24.0 GiB free, spread"]
    assert last["fixed"] == ["0", "14,000", "-"]  # its gpus: list says it all
    assert last["off"] == ["-", "-", "-"]

"""Placement for real (issue 37): a gateway process on a simulated 2 x 24 GiB box whose
memory is what fake vLLM processes report, `gpus: auto` backends run as processes. The
gateway chooses each start's GPUs and tells the child by CUDA_VISIBLE_DEVICES; the fake, as
CUDA would, holds its memory only on the GPUs it sees, as many as its
`--tensor-parallel-size`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.processes import free_port, gateway_process

pytestmark = pytest.mark.e2e

GIB = 1024


def fake(port: int, model: str, mib: int, ledger: Path, *extra: str) -> dict[str, Any]:
    return {
        "url": f"http://127.0.0.1:{port}", "models": [model], "lifecycle": "lazy",
        "vram_mib": mib, "gpus": "auto",
        "runtime": {
            "kind": "process",
            "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", model,
                        "--vram-mib", str(mib), "--sim-gpu-dir", str(ledger), *extra],
        },
    }  # fmt: skip


def models(ledger: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "gpu": {"probe": "sim", "poll_interval_s": 0.2,
                "sim": {"total_mib": 24 * GIB, "count": 2, "ledger_dir": str(ledger)}},
        "backends": {
            "big": fake(ports["big"], "big", 14 * GIB, ledger),
            "tp": fake(ports["tp"], "tp", 8 * GIB, ledger, "--tensor-parallel-size", "2"),
        },
    }  # fmt: skip


def ask(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}


def stats(port: int) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/_fake/stats", timeout=10).json()
    return found


def test_auto_backends_are_placed_and_a_tensor_parallel_child_sees_both_gpus(
    tmp_path: Path,
) -> None:
    ports = {"big": free_port(), "tp": free_port()}
    with gateway_process(models(tmp_path / "sim-gpu", ports)) as gw:
        ask(gw.url, "big")
        ask(gw.url, "tp")
        big, tp = stats(ports["big"]), stats(ports["tp"])
        assert environ(big["pid"])["CUDA_VISIBLE_DEVICES"] == "0"  # pack: the first GPU
        assert big["vram_gpus"] == [0]
        child = environ(tp["pid"])
        assert child["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert child["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert tp["vram_gpus"] == [0, 1]
        # The probe reads what the processes hold: 14 + 8 GiB on GPU 0, 8 on GPU 1.
        gpus = httpx.get(gw.url + "/status", timeout=10).json()["gpu"]["gpus"]
        assert [g["used_mib"] for g in gpus] == [22 * GIB, 8 * GIB]

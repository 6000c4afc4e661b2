"""A burst beyond the connection cap waits; it is not cut. A real `microscheduler serve`
with a small `max_connections` in front of a paced fake vLLM, and as many concurrent
streams as three times the cap, then more than the cap and its queue together (the rest
wait, connected, in the kernel's backlog while the gateway stops accepting). Every stream
must end with `data: [DONE]`: no 503, no reset, no closed socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.connections import QUEUE
from tests.fakes.processes import fake_vllm_process, gateway_process

pytestmark = pytest.mark.e2e

MODEL = "burst-model"
CAP = 10
TOKENS = 4
TOKENS_PER_S = 20.0  # a stream lasts about TOKENS / TOKENS_PER_S = 0.2 s
ADMIN = {"authorization": "Bearer burst-admin"}


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    env = {
        "MICROSCHEDULER_SERVER__MAX_CONNECTIONS": str(CAP),
        "MICROSCHEDULER_ACCESS_LOG": "false",
        "MICROSCHEDULER_ADMIN_KEY": ADMIN["authorization"].split()[1],
    }
    flags = ["--ttft", "0", "--tokens-per-second", f"{TOKENS_PER_S:g}"]
    flags += ["--max-tokens", str(TOKENS), "--max-num-seqs", "1024"]
    with ExitStack() as stack:
        upstream = stack.enter_context(fake_vllm_process(MODEL, *flags))
        config = {"backends": {"fake": {"url": upstream, "models": [MODEL]}}}
        gw = stack.enter_context(gateway_process(config, env=env, wait_ready=True))
        yield gw.url


async def one_stream(url: str) -> str | None:
    """A stream on its own connection, read to its end: None, or what went wrong."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    timeout = httpx.Timeout(60.0)
    try:
        async with (
            httpx.AsyncClient(timeout=timeout) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
        ):
            text = (await response.aread()).decode()
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"{response.status_code}: {text[:200]}"
    if not text.rstrip().endswith("data: [DONE]"):
        return f"cut: {text[-200:]!r}"
    return None


async def burst(url: str, count: int) -> tuple[list[str], float]:
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(url) for _ in range(count)))
    return [r for r in results if r is not None], time.perf_counter() - started


def connections(url: str) -> dict[str, Any]:
    view: dict[str, Any] = httpx.get(f"{url}/status", headers=ADMIN).json()
    return view["gateway"]["connections"]  # type: ignore[no-any-return]


async def test_a_burst_of_three_times_the_cap_completes(gateway: str) -> None:
    errors, wall_s = await burst(gateway, 3 * CAP)
    print(f"\n{3 * CAP} streams at a cap of {CAP}: {len(errors)} errors in {wall_s:.2f} s")
    assert errors == []
    after = connections(gateway)
    assert (after["max"], after["sized_by"], after["queued"]) == (CAP, "max_connections", 0)
    assert after["accepting"] is True


async def test_beyond_the_queue_newcomers_wait_in_the_backlog(gateway: str) -> None:
    count = CAP + QUEUE + 40  # more than the cap and the queue take: the listener pauses
    errors, wall_s = await burst(gateway, count)
    print(f"\n{count} streams at a cap of {CAP}: {len(errors)} errors in {wall_s:.2f} s")
    assert errors == [], errors[:5]
    # Through CAP connections at a time, ~0.2 s each: the burst took turns, none was cut.
    assert wall_s >= (count / CAP) * (TOKENS / TOKENS_PER_S) * 0.5
    after = connections(gateway)
    assert (after["queued"], after["accepting"]) == (0, True)


async def test_the_cap_and_its_sizing_are_in_status(gateway: str) -> None:
    view = connections(gateway)
    assert view["max"] == CAP
    assert view["summary"].startswith(f"at most {CAP} connections at once (server.max_connections")
    assert view["file_limit"]["soft"] == view["file_limit"]["hard"]  # serve raised it
    assert view["warning"] is None  # 10 connections fit any file limit
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert view["backlog"] == min(65535, somaxconn)  # as many as the kernel gives
    assert view["open"] >= 1  # this request's own
    metrics = httpx.get(f"{gateway}/metrics").text
    assert f'microscheduler_client_connections{{state="max"}} {float(CAP)}' in metrics
    assert 'microscheduler_client_connections{state="queued"} 0.0' in metrics
    assert "microscheduler_client_connections_accepting 1.0" in metrics

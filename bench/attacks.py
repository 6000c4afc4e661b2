"""`bench/soak.py`'s hostile phases against its gateway (default settings: the connection cap
sized from the file limit, 64 KiB of head): heads dribbled by many sockets, and a chunked body
followed by endless trailer fields. Each reports what normal clients got, and the gateway's
RSS before, at its peak and after.

- dribble: N sockets (1,100 and 2,000) each send `POST /v1/chat/completions HTTP/1.1`, a
  Host line, then one more header line every 2 s (reconnecting 2 s after the gateway
  closes one); once all are open, 20 normal chat requests in a row, each on a fresh
  connection: served (200) / total and the slowest. Target: all 20, each under 2 s.
- trailers: one chunked request whose last chunk is followed by trailer fields (1 KiB each)
  up to `--trailer-mib`: the gateway must refuse it (431, or close) long before, without
  growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from bench.overhead import CHAT_PATH, HOST, Proc, log

DRIBBLE_S = 2.0
NORMAL_REQUESTS = 20
QUICK_S = 2.0  # target: each normal request during the dribbling answers within this
OPEN_WAIT_S = 30.0  # for every dribbler to have opened once
Snap = Callable[[int], dict[str, Any]]
Run = Callable[[Callable[[], Awaitable[dict[str, Any]]]], dict[str, Any]]


async def _dribbler(port: int, counts: dict[str, int], all_open: asyncio.Event) -> None:
    head = f"POST {CHAT_PATH} HTTP/1.1\r\nHost: x\r\n".encode()
    while True:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            counts["connect_errors"] += 1
            await asyncio.sleep(DRIBBLE_S)  # the attack's pace
            continue
        counts["opened"] += 1
        if counts["opened"] >= counts["dribblers"]:
            all_open.set()
        try:
            writer.write(head)
            for n in range(100_000):
                try:
                    async with asyncio.timeout(DRIBBLE_S):  # the attack's pace
                        if not await reader.read(65536):
                            break  # the gateway closed it
                except TimeoutError:
                    writer.write(b"X-Drip-%d: x\r\n" % n)
        except ConnectionError:
            pass
        finally:
            writer.close()
            counts["closed"] += 1
        await asyncio.sleep(DRIBBLE_S)


async def _normal(port: int, body: bytes) -> tuple[bool, float]:
    """One chat request on a fresh connection: (served, seconds)."""
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    started = time.perf_counter()
    data = b""
    try:
        async with asyncio.timeout(30):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                writer.write(head + body)
                while chunk := await reader.read(65536):
                    data += chunk
            finally:
                writer.close()
    except (OSError, TimeoutError):
        pass
    served = data.startswith(b"HTTP/1.1 200") and b'"chat.completion"' in data
    return served, time.perf_counter() - started


async def dribble(port: int, count: int, model: str) -> dict[str, Any]:
    counts = {"dribblers": count, "opened": 0, "closed": 0, "connect_errors": 0}
    all_open = asyncio.Event()
    tasks = [asyncio.create_task(_dribbler(port, counts, all_open)) for _ in range(count)]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_open.wait(), OPEN_WAIT_S)
        await asyncio.sleep(DRIBBLE_S)  # every dribbler has sent a header line more
        results = [await _normal(port, body) for _ in range(NORMAL_REQUESTS)]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    latencies = [s for _, s in results]
    served = sum(ok for ok, _ in results)
    return {
        **counts,
        "served": served,
        "total": NORMAL_REQUESTS,
        "max_ms": round(max(latencies) * 1000, 1),
        "errors": NORMAL_REQUESTS - served,
    }


async def trailers(port: int, mib: int, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    field = b"X-Trailer-%08d: " + b"t" * 1000 + b"\r\n"
    per_write = 64
    sent = 0
    reader, writer = await asyncio.open_connection(HOST, port)
    data = b""
    try:
        writer.write(head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n")
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(300):
                for n in range(0, mib * 1024, per_write):
                    writer.write(b"".join(field % (n + i) for i in range(per_write)))
                    await writer.drain()
                    sent += per_write * len(field)
                writer.write(b"\r\n")
                await writer.drain()
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(30):
                while chunk := await reader.read(65536):
                    data += chunk
    finally:
        writer.close()
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else None
    refused = status == 431 or (status is None and sent < mib * 1024 * 1024)
    return {
        "trailer_mib": mib,
        "sent_kib": sent // 1024,
        "status": status,
        "refused": refused,
        "errors": 0 if refused else 1,
    }


def phase_attacks(
    gw: Proc,
    model: str,
    dribblers: list[int],
    trailer_mib: int,
    *,
    run: Run,
    snapshot: Snap,
    sampler: Any,
) -> dict[str, Any]:
    """Both attacks, one at a time; `run`, `snapshot` and `sampler` (RSS sampling) are soak's."""
    pid = gw.popen.pid
    res: dict[str, Any] = {"dribble": [], "errors": 0}
    for count in dribblers:
        log(f"dribbled heads: {count} sockets, then {NORMAL_REQUESTS} normal requests ...")
        before = snapshot(pid)
        with sampler(pid) as sampled:
            one = run(partial(dribble, gw.port, count, model))
        one |= {"before": before, "peak": sampled.result(), "after": snapshot(pid)}
        res["dribble"].append(one)
        res["errors"] += one["errors"]
    log(f"trailers: up to {trailer_mib} MiB after a chunked body ...")
    before = snapshot(pid)
    with sampler(pid) as sampled:
        tr = run(partial(trailers, gw.port, trailer_mib, model))
    tr |= {"before": before, "peak": sampled.result(), "after": snapshot(pid)}
    res["trailers"] = tr
    res["errors"] += tr["errors"]
    return res


def rows(res: dict[str, Any]) -> list[list[str]]:
    out = []
    for d in res["dribble"]:
        ok = d["served"] == d["total"] and d["max_ms"] < QUICK_S * 1000
        out.append([
            f"Dribbled heads: {d['dribblers']} sockets (a header line per {DRIBBLE_S:g} s): "
            "normal requests served / total, slowest (ms)", "",
            f"{d['served']} / {d['total']}, {d['max_ms']:.0f}",
            f"RSS {d['before']['rss_mb']:.1f} / {d['peak']['peak_rss_mb']:.1f} / "
            f"{d['after']['rss_mb']:.1f} MB (before / peak / after); {d['opened']} opened",
            f"all, each < {QUICK_S * 1000:.0f} ms", "PASS" if ok else "FAIL",
        ])  # fmt: skip
    t = res["trailers"]
    out.append([
        f"Trailers: up to {t['trailer_mib']} MiB after a chunked body: status / KiB sent",
        "", f"{t['status']} / {t['sent_kib']}",
        f"RSS {t['before']['rss_mb']:.1f} / {t['peak']['peak_rss_mb']:.1f} / "
        f"{t['after']['rss_mb']:.1f} MB (before / peak / after)",
        "431 or closed", "PASS" if t["refused"] else "FAIL",
    ])  # fmt: skip
    return out

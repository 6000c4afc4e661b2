"""Does the gateway's event loop stall while backends start and wake under request load?

Run `.venv/bin/python bench/looplag.py`; `--quick` for a smoke run, `--json PATH` to keep
the numbers. The gateway is a real process (`serve_quiet`) on a simulated 16,000 MiB GPU
with two backends:

- `steady`: a fake vLLM this script starts (an external backend) that streams 16 tokens
  at `--tokens-per-second` (100: 0.16 s a stream); `--clients` threads send it streaming
  chat requests through the gateway, each as soon as its last one ended: the load;
- `lazy`: a fake vLLM the gateway runs as a process (sleep mode on; a cold start waits
  `--startup-delay`, a wake copies 9.4 GiB back at `--wake-gib-per-s`).

Each round stops `lazy` through the admin API and sends it a chat request (a cold start),
then puts it to sleep and sends another (a wake): `--rounds 10` is 20 starts and wakes.
The gateway's own `microscheduler_event_loop_lag_seconds` is read from `/metrics` before
and after the rounds; the difference is the rounds' samples (one each 0.1 s): their p99
(read as Prometheus's `histogram_quantile` reads it, linear within a bucket) and the
bucket the largest fell in. A first phase, `--rest` seconds (60) with no load and nothing
starting, is the baseline. `microscheduler_event_loop_lag_max_seconds` (the largest of
the last 60 s) is read at the end of it and every 10 s during the rounds: with a rest of
60 s its window holds the rest phase and the rounds only (not the warm-up's first start),
so the largest reading is the max. With a shorter rest (`--quick`) the max is only known
to its bucket.

Last, after a quiet minute, the load runs alone as long as the rounds took: the lag the
load itself causes (on 2 cores the load's clients, the fake and the gateway share them).

Target (reported, not enforced): max under 5 ms on 2 cores. Exit code 1 only when
something broke.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.control.loop_lag import WINDOW_S
from bench import stallwatch
from bench.overhead import HOST, Proc, free_port, log, ms, serve_quiet
from bench.switch import ASLEEP_MIB, GPU_MIB, MODEL_MIB, call, chat

LAG = "microscheduler_event_loop_lag_seconds"
PEAK = "microscheduler_event_loop_lag_max_seconds"
# The lag less the loop thread's wait for a CPU (`app.control.loop_lag`): what the
# gateway's own work held the loop. The target is read there; the lag is shown beside it.
HELD = "microscheduler_event_loop_held_seconds"
HELD_PEAK = "microscheduler_event_loop_held_max_seconds"
SERIES = {LAG: PEAK, HELD: HELD_PEAK}
PHASE_KEYS = (("lag", LAG), ("held", HELD))  # a phase's summaries, by key, and their series
TARGET_MS = 5.0
PEAK_EVERY_S = 10.0  # well within the max's window; each scrape is loop time too
STREAM = json.dumps({"model": "steady", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 16, "stream": True}).encode()  # fmt: skip
Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last


def lag_of(text: str, name: str = LAG) -> tuple[Buckets, float]:
    """The histogram `name`'s buckets and its max gauge in a /metrics text."""
    buckets: Buckets = []
    peak = math.nan
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name == SERIES[name]:
                peak = sample.value
    if not buckets:
        raise RuntimeError(f"/metrics has no {name}")
    return sorted(buckets), peak


def minus(after: Buckets, before: Buckets) -> Buckets:
    return [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]


def quantile(q: float, buckets: Buckets) -> float:
    """`histogram_quantile(q, ...)` over cumulative buckets (NaN when empty)."""
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    low, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return low  # Prometheus: the highest finite bound
            return low + (le - low) * (rank - below) / (count - below)
        low, below = le, count
    return low


def largest_bucket(buckets: Buckets) -> float:
    """The upper bound of the bucket the largest sample fell in."""
    total = buckets[-1][1]
    return next(le for le, count in buckets if count >= total)


def scrape(port: int) -> dict[str, tuple[Buckets, float]]:
    """Both series (the lag, and the lag held: less the wait for a CPU), by name."""
    status, text = call(port, "GET", "/metrics")
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"/metrics answered {status}")
    return {name: lag_of(text, name) for name in SERIES}


def cpu_wait_s(pid: int) -> float:
    """Seconds the process's main thread (the event loop's) has waited for a CPU so far
    (/proc/PID/schedstat, run-queue time): lag a busy machine causes, whatever the loop does."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def start_steady(tmp: Path, tokens_per_s: float) -> Proc:
    args = ["app.sim.vllm", "--model", "steady", "--ttft", "0", "--max-tokens", "16",
            "--tokens-per-second", str(tokens_per_s)]  # fmt: skip
    proc = Proc("steady fake vLLM", args, dict(os.environ), "", tmp / "steady.log")
    proc.wait_ready(["/health"])
    return proc


def start_gateway(tmp: Path, steady: Proc, lazy_port: int, a: argparse.Namespace) -> Proc:
    """The gateway, under `bench.stallwatch` with `--stalls`."""
    ledger = tmp / "sim-gpu"
    config = tmp / "config"
    config.mkdir(parents=True, exist_ok=True)
    command = [
        "{python}", "-m", "app.sim.vllm", "--port", str(lazy_port), "--model", "lazy",
        "--max-tokens", "2", "--startup-delay", str(a.startup_delay), "--enable-sleep-mode",
        "--wake-gib-per-s", str(a.wake_gib_per_s), "--vram-mib", str(MODEL_MIB),
        "--vram-asleep-mib", str(ASLEEP_MIB), "--sim-gpu-dir", str(ledger),
    ]  # fmt: skip
    models = {
        "gpu": {"probe": "sim", "sim": {"total_mib": GPU_MIB, "ledger_dir": str(ledger)}},
        # Level-1 sleep keeps weights in host RAM: a fixed reading, not this machine's.
        "host_ram": {"sim": {"total_mib": 65536, "available_mib": 40960}},
        "backends": {
            "steady": {"url": f"http://{HOST}:{steady.port}", "models": ["steady"],
                       "runtime": {"kind": "external"}},
            "lazy": {"url": f"http://{HOST}:{lazy_port}", "models": ["lazy"],
                     "lifecycle": "lazy", "vram_mib": MODEL_MIB, "asleep_mib": ASLEEP_MIB,
                     "runtime": {"kind": "process", "command": command,
                                 "env": {"VLLM_SERVER_DEV_MODE": "1"}}},
        },
    }  # fmt: skip
    (config / "models.yaml").write_text(json.dumps(models))
    wrapper = () if a.stalls is None else ("bench.stallwatch", str(a.stalls.resolve()))
    return serve_quiet(tmp, config, wrapper=wrapper)


def stream(port: int) -> int:
    """One streaming chat request of 16 tokens to `steady`, read to its end; its status."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", STREAM, {"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Load:
    """`clients` threads streaming chat requests to `steady` until `stop()`."""

    def __init__(self, port: int, clients: int) -> None:
        self.done = threading.Event()
        self.ok = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(port,)) for _ in
                         range(clients)]  # fmt: skip

    def _client(self, port: int) -> None:
        while not self.done.is_set():
            try:
                status = stream(port)
            except OSError as exc:
                status = 0
                with self._lock:
                    self.errors.append(str(exc))
            with self._lock:
                if status == 200:
                    self.ok += 1
                elif status:
                    self.errors.append(f"steady: {status}")

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(timeout=60)


def summary(before: Buckets, after: Buckets, peak: float | None) -> dict[str, Any]:
    """The phase's samples (the histogram's difference). `peak`: the max gauge's largest
    reading in it; one above the phase's largest bucket came from before the phase (the
    gauge's window reaches back 60 s), so the max is then known to its bucket only."""
    rounds = minus(after, before)
    top = largest_bucket(rounds)
    return {"samples": int(rounds[-1][1]), "p50_ms": ms(quantile(0.5, rounds)),
            "p99_ms": ms(quantile(0.99, rounds)),
            "max_ms": None if peak is None or peak > top else ms(peak),
            "max_bucket_ms": ms(top),
            "over_5ms": int(rounds[-1][1] - dict(rounds)[0.005])}  # fmt: skip


def under_load(gw: Proc, a: argparse.Namespace, events: Callable[[], int]) -> dict[str, Any]:
    """The lag while `events()` runs (it returns how many starts and wakes it did) beside
    the request load. The max gauges are read every `PEAK_EVERY_S`; a phase comes after
    `WINDOW_S` with no load (the rest phase, or the pause), so its readings are its own."""
    load = Load(gw.port, a.clients)
    load.start()
    peaks: dict[str, list[float]] = {name: [] for name in SERIES}
    stop = threading.Event()

    def read_peaks() -> None:
        while not stop.wait(PEAK_EVERY_S):
            for name, (_, peak) in scrape(gw.port).items():
                peaks[name].append(peak)

    reader = threading.Thread(target=read_peaks)
    try:
        time.sleep(1.0)  # the load settles
        before = scrape(gw.port)
        began, cpu0, wait0 = time.monotonic(), gw.cpu_s(), cpu_wait_s(gw.popen.pid)
        reader.start()
        done = events()
        wall, cpu = time.monotonic() - began, gw.cpu_s() - cpu0
        waited = cpu_wait_s(gw.popen.pid) - wait0
    finally:
        stop.set()
        if reader.is_alive():
            reader.join(timeout=30)
        load.stop()
    after = scrape(gw.port)
    if load.errors:
        raise RuntimeError(f"load: {len(load.errors)} errors, e.g. {load.errors[:3]}")
    exact = a.rest >= WINDOW_S  # nothing from before the quiet minute is in the window
    series = {
        key: summary(before[name][0], after[name][0],
                     max([*peaks[name], after[name][1]]) if exact else None)
        for key, name in PHASE_KEYS
    }  # fmt: skip
    return {**series,
            "starts_and_wakes": done, "wall_s": round(wall, 1), "load_requests": load.ok,
            "load_rps": round(load.ok / wall, 1), "gateway_cpu_pct": round(100 * cpu / wall),
            "loop_cpu_wait_s": round(waited, 2),
            "loadavg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


def starts_and_wakes(gw: Proc, rounds: int) -> int:
    """`rounds` times: stop `lazy`, ask it (a cold start); put it to sleep, ask it (a wake)."""
    for i in range(rounds):
        for how in ("stop", "sleep"):
            status, view = call(gw.port, "POST", f"/backends/lazy/{how}")
            if status != 200:
                raise RuntimeError(f"{how} answered {status}: {view}")
            status, _, total = chat(gw.port, "lazy", stream=False)
            if status != 200:
                raise RuntimeError(f"round {i}: the request after {how} answered {status}")
            log(f"round {i + 1}/{rounds}: {'start' if how == 'stop' else 'wake'} "
                f"answered in {ms(total):.0f} ms")  # fmt: skip
    return 2 * rounds


def at_rest(gw: Proc, seconds: float) -> dict[str, Any]:
    before = scrape(gw.port)
    time.sleep(seconds)
    after = scrape(gw.port)
    exact = seconds >= WINDOW_S
    return {
        key: summary(before[name][0], after[name][0], after[name][1] if exact else None)
        for key, name in PHASE_KEYS
    }


def phases(gw: Proc, a: argparse.Namespace) -> dict[str, Any]:
    """At rest; starts and wakes under load; a quiet pause; the load alone for as long."""
    rest = at_rest(gw, a.rest)
    rounds = under_load(gw, a, lambda: starts_and_wakes(gw, a.rounds))
    log(f"{a.rest:g} s quiet, then the load alone for {rounds['wall_s']} s")
    time.sleep(a.rest)

    def nothing() -> int:
        time.sleep(rounds["wall_s"])
        return 0

    alone = under_load(gw, a, nothing)
    return {"rest": rest, "rounds": rounds, "load_alone": alone}


def verdict(p: dict[str, Any]) -> str:
    if p["max_ms"] is None:  # known to its bucket only: under or at its bound
        return "PASS (to its bucket)" if p["max_bucket_ms"] <= TARGET_MS else "MISS"
    return "PASS" if p["max_ms"] < TARGET_MS else "MISS"


def render(res: dict[str, Any]) -> str:
    r, rest, alone = res["rounds"], res["rest"], res["load_alone"]

    def row(label: str, p: dict[str, Any], target: str) -> str:
        top = f"<= {p['max_bucket_ms']:g} ms (its bucket)"
        if p["max_ms"] is not None:
            top = f"{p['max_ms']:.1f} ms (bucket <= {p['max_bucket_ms']:g} ms)"
        return (f"| {label} | {p['samples']} | {p['p50_ms']:.2f} ms | {p['p99_ms']:.2f} ms "
                f"| {top} | {p['over_5ms']} | {target} |")  # fmt: skip

    def table(key: str, target: str) -> list[str]:
        return [
            "| phase | samples | p50 | p99 | max | over 5 ms | target |",
            "|---|---:|---:|---:|---:|---:|---|",
            row(f"at rest, {res['rest_s']:g} s", rest[key], "-"),
            row(f"{r['starts_and_wakes']} starts and wakes under load", r[key], target),
            row("the load alone, as long", alone[key], "-"),
        ]

    return "\n".join([
        f"Event loop lag ({res['machine']})", "",
        "Held: the lag less the loop's thread's wait for a CPU meanwhile "
        f"({HELD}): what the gateway's own work held the loop.", "",
        *table("held", f"max < {TARGET_MS:g} ms: {verdict(r['held'])}"), "",
        f"The lag itself ({LAG}), the machine's wait for a CPU included:", "",
        *table("lag", f"(max < {TARGET_MS:g} ms: {verdict(r['lag'])})"), "",
        f"Load: {res['clients']} clients streaming chat requests (16 tokens at "
        f"{res['tokens_per_s']:g}/s). With the starts and wakes: {r['load_rps']}/s, gateway "
        f"CPU {r['gateway_cpu_pct']}% of a core, its loop's thread waited "
        f"{r['loop_cpu_wait_s']} s for a CPU in {r['wall_s']} s, load average "
        f"{r['loadavg_1m']}. Alone: {alone['load_rps']}/s, {alone['gateway_cpu_pct']}%, "
        f"waited {alone['loop_cpu_wait_s']} s, load average {alone['loadavg_1m']}.",
        f"Command: {res['command']}",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/looplag.py", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="each a cold start and a wake")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--tokens-per-second", dest="tokens_per_s", type=float, default=100.0)
    p.add_argument("--startup-delay", type=float, default=1.0)
    p.add_argument("--wake-gib-per-s", type=float, default=10.0)
    p.add_argument("--rest", type=float, default=WINDOW_S, help="seconds of the baseline")
    p.add_argument("--quick", action="store_true", help="2 rounds, 2 clients, 2 s at rest")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--stalls",
        type=Path,
        metavar="OUT",
        help="run the gateway under bench/stallwatch.py, which writes each stall of its "
        "loop over 4 ms with its stack to OUT; a summary is printed (a diagnostic: the "
        "sampling costs CPU, so the lag numbers of such a run are not the gateway's own)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.clients, a.rest, a.startup_delay, a.wake_gib_per_s = 2, 2, 2.0, 0.3, 40.0
    with tempfile.TemporaryDirectory(prefix="bench-looplag-") as tmp:
        procs: list[Proc] = []
        try:
            procs.append(start_steady(Path(tmp), a.tokens_per_s))
            procs.append(start_gateway(Path(tmp), procs[0], free_port(), a))
            gw = procs[1]
            if chat(gw.port, "lazy", stream=False)[0] != 200:  # its first start: warm
                raise RuntimeError("the first request to lazy failed")
            time.sleep(1.0)
            measured = phases(gw, a)
        except (RuntimeError, OSError, ValueError) as exc:
            log(f"FAILED: {exc}{procs[-1].tail() if procs else ''}")
            return 1
        finally:
            for proc in reversed(procs):
                proc.stop()
    options = (f"--rounds {a.rounds} --clients {a.clients} --tokens-per-second "
               f"{a.tokens_per_s:g} --startup-delay {a.startup_delay:g} --wake-gib-per-s "
               f"{a.wake_gib_per_s:g} --rest {a.rest:g}")  # fmt: skip
    res = {
        "quick": a.quick, "rest_s": a.rest, "clients": a.clients,
        "tokens_per_s": a.tokens_per_s, **measured,
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "target_ms": TARGET_MS, "command": f"python bench/looplag.py {options}",
    }  # fmt: skip
    print(render(res))
    if a.stalls is not None:
        print("", f"Stalls over 4 ms by where the loop was ({a.stalls}):", sep="\n")
        print("\n".join(f"- {line}" for line in stallwatch.summary(a.stalls)) or "- none")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

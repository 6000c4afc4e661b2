"""Does a chatty backend take the gateway down? (issue 33)

Run `.venv/bin/python bench/chatty.py` (or `make bench`); `--quick` for a smoke run,
`--json PATH` to keep the numbers. The gateway is a real process with one lazy process
backend: the fake vLLM run under `app.sim.chatty`, which writes ~200-byte log lines to the
server's stdout at `--mb-per-s` (400) for `--seconds` (30), as vLLM does with DEBUG
logging or `--enable-log-requests`. The backend is started through the admin API; while it
writes, the bench measures:

- `GET /health` latency, one request every 50 ms on a fresh connection (timeout 5 s: a
  timeout counts as 5 s and is counted);
- the gateway's RSS (sampled from /proc every 0.2 s; peak);
- the output files `logs/chatty.log` and `chatty.log.1` (largest size seen, and at the end);
- what the chatty server wrote, and the lines the gateway dropped (its metrics);

then sends SIGTERM to the gateway and times its exit (up to 60 s, then SIGKILL).

Targets (reported, not enforced): `/health` p99 and max under 100 ms, peak RSS under
200 MB, each output file within the cap (16 MiB), exit within the shutdown grace plus the
backend's stop. Exit code 1 only when something broke.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.overhead import HOST, Proc, free_port, log, ms, pct, serve_quiet

MODEL = "chatty-model"
BACKEND = "chatty"
CAP_BYTES = 16 * 1024 * 1024
HEALTH_EVERY_S = 0.05
HEALTH_TIMEOUT_S = 5.0
EXIT_WAIT_S = 60.0
STATS = "chatty-written"  # what the chatty server wrote, in bytes (it updates it)
CHATTER_AFTER_S = 20.0  # it writes this much longer than measured: SIGTERM comes mid-flood
TARGET_HEALTH_MS = 100.0
TARGET_RSS_MB = 200.0


def call(port: int, method: str, path: str, timeout: float = 120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_wait_s(pid: int) -> float:
    """Seconds the process's threads have waited for a CPU (run queue) so far: what a busy
    machine adds to every answer, whatever the gateway does (/proc/PID/task/*/schedstat)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(stat.read_text().split()[1])
    return total / 1e9


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def start_gateway(tmp: Path, port: int, mb_per_s: float, seconds: float) -> Proc:
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    command = [
        "{python}", "-m", "app.sim.chatty", "--mb-per-s", str(mb_per_s),
        "--seconds", str(seconds + CHATTER_AFTER_S), "--then-exit",
        "--stats", str(tmp / STATS), "--",
        "{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", MODEL,
        "--max-tokens", "1",
    ]  # fmt: skip
    backend = {
        "url": f"http://{HOST}:{port}",
        "models": [MODEL],
        "lifecycle": "lazy",
        "vram_mib": 1000,
        "runtime": {"kind": "process", "command": command, "stop_grace_s": 5},
    }
    (config / "models.yaml").write_text(json.dumps({"backends": {BACKEND: backend}}))
    return serve_quiet(tmp, config)


class Sampler:
    """/health latency, RSS and file sizes, sampled in threads until `stop()`."""

    def __init__(self, gw: Proc, logs: Path) -> None:
        self.gw, self.logs = gw, logs
        self.health: list[tuple[float, float]] = []  # (when sent, ms)
        self.health_failures = 0
        self.rss_mb: list[float] = []
        self.max_log = 0
        self.max_log1 = 0
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._health, daemon=True),
            threading.Thread(target=self._proc, daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(HEALTH_TIMEOUT_S + 1)

    def _health(self) -> None:
        while not self._done.is_set():
            began = time.monotonic()
            try:
                status, _ = call(self.gw.port, "GET", "/health", timeout=HEALTH_TIMEOUT_S)
                if status != 200:
                    self.health_failures += 1
            except OSError:
                self.health_failures += 1
            self.health.append((began, ms(time.monotonic() - began)))
            self._done.wait(HEALTH_EVERY_S)

    def _proc(self) -> None:
        while not self._done.is_set():
            self.rss_mb.append(rss_mb(self.gw.popen.pid))
            self.max_log = max(self.max_log, size_of(self.logs / f"{BACKEND}.log"))
            self.max_log1 = max(self.max_log1, size_of(self.logs / f"{BACKEND}.log.1"))
            self._done.wait(0.2)


def dropped(port: int) -> dict[str, float]:
    """The gateway's own count of what it dropped, from /metrics (0 when it has none)."""
    found = {"dropped_lines": 0.0, "skipped_bytes": 0.0}
    try:
        _, body = call(port, "GET", "/metrics", timeout=HEALTH_TIMEOUT_S)
    except OSError:
        return found
    for line in body.decode(errors="replace").splitlines():
        name = line.split("{", 1)[0]
        if name == "microscheduler_backend_output_dropped_lines_total":
            found["dropped_lines"] += float(line.rsplit(" ", 1)[1])
        elif name == "microscheduler_backend_output_skipped_bytes_total":
            found["skipped_bytes"] += float(line.rsplit(" ", 1)[1])
    return found


def chatty_written(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def sigterm_exit_s(gw: Proc) -> float | None:
    """SIGTERM to the gateway, then the seconds until it exited (None: it did not within
    `EXIT_WAIT_S`, and was killed)."""
    began = time.monotonic()
    gw.popen.send_signal(signal.SIGTERM)
    try:
        gw.popen.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        gw.popen.kill()
        gw.popen.wait(15)
        return None
    return time.monotonic() - began


def run(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    port = free_port()
    gw = start_gateway(tmp, port, a.mb_per_s, a.seconds)
    logs = tmp / "var" / "logs"
    try:
        sampler = Sampler(gw, logs)
        rss_before = rss_mb(gw.popen.pid)
        cpu_before = gw.cpu_s()
        waited_before = cpu_wait_s(gw.popen.pid)
        sampler.start()
        time.sleep(a.baseline)  # /health with the backend stopped, for comparison
        waited_baseline = cpu_wait_s(gw.popen.pid) - waited_before
        log(f"starting the chatty backend: {a.mb_per_s:g} MB/s for {a.seconds:g} s")
        began = time.monotonic()
        started: list[Any] = []

        def start() -> None:
            try:
                started.append(call(gw.port, "POST", f"/backends/{BACKEND}/start", timeout=120))
            except OSError as exc:
                started.append(exc)
            started.append(time.monotonic() - began)

        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        time.sleep(a.seconds)
        counted = dropped(gw.port)
        cpu_s = gw.cpu_s() - cpu_before
        waited = cpu_wait_s(gw.popen.pid) - waited_before - waited_baseline
        sampler.stop()
        log("SIGTERM to the gateway (the backend still writing)")
        exit_s = sigterm_exit_s(gw)
        starter.join(10)
    finally:
        gw.stop()
    # The start's answer: (status, body) and its time, or nothing yet when SIGTERM came.
    start_s = started[1] if len(started) == 2 and not isinstance(started[0], OSError) else None
    start_status = started[0][0] if start_s is not None else None
    baseline = [latency for at, latency in sampler.health if at < began]
    health = [latency for at, latency in sampler.health if at >= began]
    written = chatty_written(tmp / STATS)
    slow = [(round(at - began, 2), latency) for at, latency in sampler.health if latency > 50]
    return {
        "mb_per_s": a.mb_per_s,
        "seconds": a.seconds,
        "baseline_s": a.baseline,
        "start_s": None if start_s is None else round(start_s, 2),
        "start_status": start_status,
        "written_mb": round(written / 1e6, 1),
        "baseline": {
            "n": len(baseline),
            "p50_ms": round(pct(baseline, 50), 2),
            "p99_ms": round(pct(baseline, 99), 2),
            "max_ms": round(max(baseline), 2),
        },
        "health": {
            "n": len(health),
            "failures": sampler.health_failures,
            "p50_ms": round(pct(health, 50), 2),
            "p99_ms": round(pct(health, 99), 2),
            "max_ms": round(max(health), 2),
        },
        "rss_mb": {"before": round(rss_before, 1), "peak": round(max(sampler.rss_mb), 1)},
        "gateway_cpu_s": round(cpu_s, 2),
        "gateway_cpu_wait_s": {"baseline": round(waited_baseline, 3), "flood": round(waited, 3)},
        "files": {
            "cap_bytes": CAP_BYTES,
            "log_max_bytes": sampler.max_log,
            "log1_max_bytes": sampler.max_log1,
            "log_end_bytes": size_of(logs / f"{BACKEND}.log"),
            "log1_end_bytes": size_of(logs / f"{BACKEND}.log.1"),
        },
        "dropped": counted,
        "slow_health": slow,  # (seconds after the start was asked, ms) of those over 50 ms
        "sigterm_exit_s": None if exit_s is None else round(exit_s, 2),
        "gateway_exit_code": gw.popen.returncode,
    }


def render(res: dict[str, Any]) -> str:
    h, b, r, f = res["health"], res["baseline"], res["rss_mb"], res["files"]
    mib = 1024 * 1024
    exit_s = res["sigterm_exit_s"]
    rows = [
        ("/health p50 / p99 / max", f"{h['p50_ms']} / {h['p99_ms']} / {h['max_ms']} ms",
         f"p99, max < {TARGET_HEALTH_MS:g} ms",
         h["max_ms"] < TARGET_HEALTH_MS and h["failures"] == 0),
        ("/health p50 / p99 / max before the start", f"{b['p50_ms']} / {b['p99_ms']} / "
         f"{b['max_ms']} ms", "(the machine's own)", None),
        ("/health failures (of n)", f"{h['failures']} of {h['n']}", "0", h["failures"] == 0),
        ("gateway RSS before / peak", f"{r['before']} / {r['peak']} MB",
         f"< {TARGET_RSS_MB:g} MB", r["peak"] < TARGET_RSS_MB),
        ("gateway CPU, baseline and flood", f"{res['gateway_cpu_s']} s in "
         f"{res['seconds'] + res['baseline_s']:g} s", "", None),
        ("gateway's wait for a CPU before / during",
         f"{res['gateway_cpu_wait_s']['baseline']} s in {res['baseline_s']:g} s / "
         f"{res['gateway_cpu_wait_s']['flood']} s in {res['seconds']:g} s", "", None),
        ("NAME.log, NAME.log.1 largest seen",
         f"{f['log_max_bytes'] / mib:.1f} / {f['log1_max_bytes'] / mib:.1f} MiB",
         f"each <= {CAP_BYTES / mib:g} MiB",
         max(f["log_max_bytes"], f["log1_max_bytes"]) <= CAP_BYTES),
        ("lines dropped / bytes skipped (metrics)",
         f"{res['dropped']['dropped_lines']:.0f} / {res['dropped']['skipped_bytes']:.0f}",
         "", None),
        ("SIGTERM to exit", "did not exit in 60 s" if exit_s is None else f"{exit_s} s",
         "exits", exit_s is not None),
    ]  # fmt: skip
    start = res["start_s"]
    answered = "not before SIGTERM" if start is None else f"{res['start_status']} in {start} s"
    rate = res["written_mb"] / res["seconds"]
    out = [
        f"chatty backend: {res['mb_per_s']:g} MB/s asked for {res['seconds']:g} s; it wrote "
        f"{res['written_mb']:g} MB by SIGTERM (~{rate:.0f} MB/s); its start answered {answered}",
        "",
        "| | measured | target | |",
        "|---|---:|---|---|",
    ]
    for name, value, target, ok in rows:
        verdict = "" if ok is None else ("PASS" if ok else "FAIL")
        out.append(f"| {name} | {value} | {target} | {verdict} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb-per-s", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds before the start")
    parser.add_argument("--quick", action="store_true", help="5 s: a smoke run")
    parser.add_argument("--json", type=Path, help="write the numbers there")
    a = parser.parse_args(argv)
    if a.quick:
        a.seconds, a.baseline = 5.0, 1.0
    with tempfile.TemporaryDirectory(prefix="bench-chatty-") as tmp:
        try:
            res = run(a, Path(tmp))
        except (RuntimeError, OSError) as exc:
            log(f"failed: {exc}")
            return 1
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

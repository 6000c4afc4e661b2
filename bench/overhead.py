"""What the gateway adds: the same requests direct to a fake vLLM, via a bare relay, via it.

Run `.venv/bin/python bench/overhead.py` (or `make bench`); `--quick` for a smoke run,
`--json PATH` to keep the numbers. The servers are real processes on 127.0.0.1 started
(and always stopped) by this script; the phases run one at a time. Targets are reported,
not enforced: the exit code is 1 only when something broke (a process did not start, a
response was wrong or failed), 2 when wrk is missing outside `--quick`.

The targets are relative, so they measure the code rather than the machine: the bare
relay (`bench.bare_relay`: uvicorn + aiohttp, no logic) runs beside the gateway in the
same run, and the gateway's CPU per request under load is stated as a ratio to it (at
most 2x); its added p50 is stated against direct (at most 0.4 ms).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
MODEL = "bench-model"
CHAT_PATH = "/v1/chat/completions"
TOKENS = 16  # a stream is a role event, one event per token (the last has finish_reason), [DONE]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
# Reported, not enforced (the exit code says only whether something broke). Issue 35: the
# gateway's CPU per request at most 2x the bare relay's, measured in the same run (it was
# ">= 4,000 req/s on 2 cores", a figure of the machine as much as of the code).
TARGETS = {"added_p50_ms": 0.4, "cpu_vs_bare": 2.0, "added_first_p50_ms": 1.0}

Load = Callable[[int], dict[str, Any]]


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --- a lean client ------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: bytes
    first_s: float  # request sent -> first body chunk in (chunked responses)
    total_s: float  # request sent -> whole body in


def raw_request(
    body: dict[str, Any], port: int, path: str = CHAT_PATH, *, key: str | None = None
) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data


class Conn:
    """A minimal blocking HTTP/1.1 keep-alive client; it costs the same for both targets."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _line(self) -> bytes:
        while (i := self.buf.find(b"\r\n")) < 0:
            self._more()
        return self._take(i + 2)[:-2]

    def exchange(self, request: bytes) -> Reply:
        start = time.perf_counter()
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        lines = self._take(end + 4).decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        first = None
        if "content-length" in headers:
            body = self._take(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int(self._line().split(b";")[0], 16):
                parts.append(self._take(size + 2)[:-2])
                first = first or time.perf_counter()
            while self._line():  # trailers, if any
                pass
            body = b"".join(parts)
        else:
            raise ValueError(f"response without a length or chunked framing: {lines[0]}")
        done = time.perf_counter()
        return Reply(int(lines[0].split()[1]), body, (first or done) - start, done - start)


def valid(reply: Reply, *, stream: bool) -> bool:
    body = reply.body
    if stream:
        tokens = body.count(b'"delta":{"content"')
        return reply.status == 200 and tokens == TOKENS and body.endswith(b"data: [DONE]\n\n")
    return reply.status == 200 and b'"chat.completion"' in body


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


class Proc:
    """A server process: started, polled until ready (bounded), stopped by its own handle."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], note: str, logf: Path):
        self.name, self.note, self.log, self.port = name, note, logf, free_port()
        self.cmd = [sys.executable, "-m", *args, "--port", str(self.port)]
        with logf.open("wb") as out:
            self.popen = subprocess.Popen(
                self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, paths: list[str], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for path in paths:
            while not self._answers_200(path):
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.popen.returncode}){self.tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: {path} not 200 after {timeout_s:g}s")
                time.sleep(0.05)

    def _answers_200(self, path: str) -> bool:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=1)
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=15)

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-15:]
        return f"\n--- last lines of {self.name}'s output:\n" + "\n".join(lines)

    def cpu_s(self) -> float:
        """User + system CPU seconds used so far (Linux /proc; 0.0 elsewhere)."""
        try:
            stat = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def command_line(self) -> str:
        shown = ["python" if c == sys.executable else c for c in self.cmd]
        return " ".join([self.note, *shown] if self.note else shown)


def start_fake(tmp: Path, procs: list[Proc]) -> Proc:
    args = ["app.sim.vllm", "--model", MODEL, "--ttft", "0", "--tokens-per-second", "0"]
    proc = Proc(
        "fake vLLM", [*args, "--max-tokens", str(TOKENS)], dict(os.environ), "", tmp / "fake.log"
    )
    procs.append(proc)
    proc.wait_ready(["/health"])
    return proc


# keys.yaml for the keys phase: three keys, every limit on (set high enough that nothing
# is refused, so each request runs every check); the load uses the first.
BENCH_KEYS = {
    "bench": {"key_env": "BENCH_KEY_1", "models": [MODEL], "priority": "high", "rpm": 10**9,
              "tpm": 10**12, "max_concurrent": 10_000, "daily_cloud_tokens": 10**12},
    "family": {"key_env": "BENCH_KEY_2", "rpm": 600, "tpm": 200_000, "max_concurrent": 8},
    "batch": {"key_env": "BENCH_KEY_3", "priority": "low", "cloud": False, "tpm": 100_000},
}  # fmt: skip
BENCH_SECRETS = {"BENCH_KEY_1": "sk-bench-1", "BENCH_KEY_2": "sk-bench-2",
                 "BENCH_KEY_3": "sk-bench-3"}  # fmt: skip
BENCH_KEY = BENCH_SECRETS["BENCH_KEY_1"]


def start_bare(tmp: Path, fake: Proc, procs: list[Proc]) -> Proc:
    """The bare relay (`bench.bare_relay`) in front of the same fake vLLM."""
    args = ["bench.bare_relay", "--upstream", f"http://{HOST}:{fake.port}"]
    proc = Proc("bare relay", args, dict(os.environ), "", tmp / "bare.log")
    procs.append(proc)
    proc.wait_ready(["/health"])
    return proc


def start_gateway(
    tmp: Path, fake: Proc, procs: list[Proc], *, access_log: bool, keys: bool = False
) -> Proc:
    config = tmp / ("config-keys" if keys else "config")
    config.mkdir(exist_ok=True)
    if keys:
        (config / "keys.yaml").write_text(json.dumps({"keys": BENCH_KEYS}))  # JSON is YAML
    (config / "models.yaml").write_text(
        f"backends:\n  bench:\n    url: http://{HOST}:{fake.port}\n"
        f"    models: [{MODEL}]\n    runtime: {{kind: external}}\n"
    )
    # Measure the defaults: no MICROSCHEDULER_* setting leaks in from the caller's shell.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    note = "" if access_log else "MICROSCHEDULER_ACCESS_LOG=false"
    if note:
        env["MICROSCHEDULER_ACCESS_LOG"] = "false"
    if keys:
        env.update(BENCH_SECRETS)
    # Not the checkout's var/, and one per gateway: two gateways never share a state
    # directory (the second would refuse to start).
    env["MICROSCHEDULER_STATE_DIR"] = str(tmp / f"var-{len(procs)}")
    args = ["app.cli", "serve", "--config", str(config), "--host", HOST]
    name = "gateway" if access_log else "gateway (access log off)"
    name += " with keys.yaml" if keys else ""
    proc = Proc(name, args, env, note, tmp / f"gateway-{len(procs)}.log")
    procs.append(proc)
    proc.wait_ready(["/health", "/ready"])
    return proc


def serve_quiet(tmp: Path, config: Path, *, wrapper: tuple[str, ...] = ()) -> Proc:
    """A gateway on `config` (its default settings, but the access log off: the benches
    that time something else), with its own state directory under `tmp`; ready when it
    returns. `wrapper`: a module (and its arguments) that runs the gateway's
    (`bench.stallwatch`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    env["MICROSCHEDULER_STATE_DIR"] = str(tmp / "var")
    env["MICROSCHEDULER_ACCESS_LOG"] = "false"
    args = [*wrapper, "app.cli", "serve", "--config", str(config), "--host", HOST]
    proc = Proc("gateway", args, env, "", tmp / "gateway.log")
    proc.wait_ready(["/health", "/ready"])
    return proc


# --- phases -------------------------------------------------------------------------------


def alternate(
    ports: list[int],
    body: dict[str, Any],
    n: int,
    warmup: int,
    *,
    requests: list[bytes] | None = None,
) -> list[list[Reply]]:
    """`n` timed requests per port after `warmup`, alternating targets and who goes first
    (`requests`: a request per port, instead of `body` to the chat path of each)."""
    conns = [Conn(p) for p in ports]
    if requests is None:
        requests = [raw_request(body, p) for p in ports]
    out: list[list[Reply]] = [[] for _ in ports]
    try:
        for i in range(warmup + n):
            for k in range(len(ports)) if i % 2 else reversed(range(len(ports))):
                reply = conns[k].exchange(requests[k])
                if i >= warmup:
                    out[k].append(reply)
    finally:
        for conn in conns:
            conn.sock.close()
    return out


def phase_latency(
    fake: Proc, gw: Proc, n: int, warmup: int, *, stream: bool, bare: Proc | None = None
) -> dict[str, Any]:
    """Sequential requests on one connection per target; percentiles and gateway - direct
    (and `bare` relay - direct, when given: the three alternated)."""
    body = {**BODY, "stream": True} if stream else BODY  # the very body wrk sends, when not
    procs = [fake, gw] if bare is None else [fake, bare, gw]
    replies = alternate([proc.port for proc in procs], body, n, warmup)
    d, g = replies[0], replies[-1]
    res: dict[str, Any] = {"requests": n, "warmup": warmup}
    stats = {"first_p50": ("first_s", 50), "end_p50": ("total_s", 50)}
    if not stream:
        stats = {"p50": ("total_s", 50), "p99": ("total_s", 99)}
    for name, (attr, p) in stats.items():
        dv, gv = (pct([getattr(r, attr) for r in side], p) for side in (d, g))
        res |= {f"direct_{name}_ms": ms(dv), f"gateway_{name}_ms": ms(gv)}
        res[f"added_{name}_ms"] = ms(gv - dv)
        if bare is not None:
            bv = pct([getattr(r, attr) for r in replies[1]], p)
            res |= {f"bare_{name}_ms": ms(bv), f"bare_added_{name}_ms": ms(bv - dv)}
    res["errors"] = sum(not valid(r, stream=stream) for side in replies for r in side)
    return res


# API -> (gateway path, gateway body, direct path, direct body, a marker of a right answer).
# Messages are translated: the direct call is the chat request the gateway sends upstream.
APIS: dict[str, tuple[str, dict[str, Any], str, dict[str, Any], bytes]] = {
    "chat": (CHAT_PATH, BODY, CHAT_PATH, BODY, b'"chat.completion"'),
    "responses": (
        "/v1/responses",
        {"model": MODEL, "input": "hi", "max_output_tokens": TOKENS},
        "/v1/responses",
        {"model": MODEL, "input": "hi", "max_output_tokens": TOKENS},
        b'"object":"response"',
    ),
    "messages (translated)": (
        "/v1/messages",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS},
        CHAT_PATH,
        BODY,
        b'"type":"message"',
    ),
}


def phase_apis(fake: Proc, gw: Proc, n: int, warmup: int) -> dict[str, Any]:
    """Sequential non-streaming requests per API: gateway vs the upstream call it makes."""
    res: dict[str, Any] = {"requests": n, "warmup": warmup, "apis": {}, "errors": 0}
    for name, (path, body, direct_path, direct_body, marker) in APIS.items():
        requests = [
            raw_request(direct_body, fake.port, direct_path),
            raw_request(body, gw.port, path),
        ]
        d, g = alternate([fake.port, gw.port], body, n, warmup, requests=requests)
        dv, gv = (pct([r.total_s for r in replies], 50) for replies in (d, g))
        res["apis"][name] = {
            "direct_p50_ms": ms(dv),
            "gateway_p50_ms": ms(gv),
            "added_p50_ms": ms(gv - dv),
        }
        res["errors"] += sum(r.status != 200 for r in d)
        res["errors"] += sum(r.status != 200 or marker not in r.body for r in g)
    return res


def wrk_load(port: int, secs: float, conns: int, threads: int, script: Path) -> dict[str, Any]:
    url = f"http://{HOST}:{port}{CHAT_PATH}"
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{secs:g}s", "-s", str(script), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60, check=False)

    def numbers(pattern: str) -> list[float]:
        found = re.search(pattern, done.stdout)
        return [float(x) for x in found.groups()] if found else []

    rps, total = numbers(r"Requests/sec:\s+([\d.]+)"), numbers(r"(\d+) requests in")
    if done.returncode != 0 or not rps or not total:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    errors = numbers(r"Non-2xx or 3xx responses: (\d+)")
    errors += numbers(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
    return {"rps": rps[0], "requests": int(total[0]), "errors": int(sum(errors))}


def python_load(port: int, secs: float, conns: int, key: str | None = None) -> dict[str, Any]:
    """The fallback without wrk: `conns` threads, each a keep-alive loop for `secs` seconds."""
    counts = [[0, 0] for _ in range(conns)]  # per thread: ok, errors
    request, deadline = raw_request(BODY, port, key=key), time.perf_counter() + secs

    def worker(slot: list[int]) -> None:
        try:
            conn = Conn(port)
            while time.perf_counter() < deadline:
                slot[0 if valid(conn.exchange(request), stream=False) else 1] += 1
            conn.sock.close()
        except (OSError, ValueError):
            slot[1] += 1

    threads = [threading.Thread(target=worker, args=(c,)) for c in counts]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(secs + 30)
    ok = sum(c[0] for c in counts)
    rps = ok / (time.perf_counter() - started)
    return {"rps": rps, "requests": ok, "errors": sum(c[1] for c in counts)}


def phase_throughput(
    fake: Proc, gw: Proc, load: Load, runs: int, bare: Proc | None = None
) -> dict[str, Any]:
    """`runs` rounds of (direct, [bare relay,] gateway), the order reversed every other
    round; the best of each, and the servers' CPU per request. With `bare`: the gateway's
    CPU per request over all its rounds as a ratio to the bare relay's (`cpu_vs_bare`)."""
    targets = [("direct", fake), ("gateway", gw)]
    if bare is not None:
        targets.insert(1, ("bare", bare))
    rounds = []
    for r in range(runs):
        row = {}
        for label, target in targets if r % 2 == 0 else targets[::-1]:  # who goes last swaps
            before = fake.cpu_s(), target.cpu_s()
            res = load(target.port)
            n = max(res["requests"], 1)
            res["fake_cpu_us_per_req"] = round((fake.cpu_s() - before[0]) / n * 1e6, 1)
            if target is not fake:
                res["relay_cpu_s"] = round(target.cpu_s() - before[1], 3)
                res[f"{label}_cpu_us_per_req"] = round(res["relay_cpu_s"] / n * 1e6, 1)
            row[label] = res
        rounds.append(row)
    best = {label: max(r[label]["rps"] for r in rounds) for label, _ in targets}
    out: dict[str, Any] = {
        "runs": rounds,
        "direct_rps": round(best["direct"], 1),
        "gateway_rps": round(best["gateway"], 1),
        "ratio": round(best["gateway"] / best["direct"], 3),
        "errors": sum(r[k]["errors"] for r in rounds for k, _ in targets),
    }
    if bare is not None:
        per_req = {
            label: sum(r[label]["relay_cpu_s"] for r in rounds)
            / max(sum(r[label]["requests"] for r in rounds), 1)
            for label in ("bare", "gateway")
        }
        out |= {
            "bare_rps": round(best["bare"], 1),
            "bare_cpu_us_per_req": round(per_req["bare"] * 1e6, 1),
            "gateway_cpu_us_per_req": round(per_req["gateway"] * 1e6, 1),
            "cpu_vs_bare": round(per_req["gateway"] / max(per_req["bare"], 1e-9), 2),
        }
    return out


def phase_keys(
    plain: Proc, keyed: Proc, loads: tuple[Load, Load], n: int, warmup: int, runs: int
) -> dict[str, Any]:
    """The cost of client keys: the same gateway without and with keys.yaml (3 keys, every
    limit on), sequential (plain and streamed) and throughput, alternated in one run."""
    res: dict[str, Any] = {"requests": n, "warmup": warmup}
    for name, body, stream in (
        ("p50", BODY, False),
        ("stream_end_p50", {**BODY, "stream": True}, True),
    ):
        requests = [raw_request(body, plain.port), raw_request(body, keyed.port, key=BENCH_KEY)]
        p, k = alternate([plain.port, keyed.port], body, n, warmup, requests=requests)
        pv, kv = pct([r.total_s for r in p], 50), pct([r.total_s for r in k], 50)
        res |= {
            f"plain_{name}_ms": ms(pv),
            f"keyed_{name}_ms": ms(kv),
            f"added_{name}_ms": ms(kv - pv),
        }
        res["errors"] = res.get("errors", 0) + sum(not valid(r, stream=stream) for r in p + k)
    rounds = []
    for _ in range(runs):
        rounds.append(
            {
                label: load(target.port)
                for label, target, load in (("plain", plain, loads[0]), ("keyed", keyed, loads[1]))
            }
        )
    best_p = max(r["plain"]["rps"] for r in rounds)
    best_k = max(r["keyed"]["rps"] for r in rounds)
    res |= {
        "runs": rounds,
        "plain_rps": round(best_p, 1),
        "keyed_rps": round(best_k, 1),
        "ratio": round(best_k / best_p, 3),
    }
    res["errors"] += sum(r[side]["errors"] for r in rounds for side in ("plain", "keyed"))
    return res  # fmt: skip


# --- report -------------------------------------------------------------------------------


def machine(use_wrk: bool) -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    models = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
    packages = {}
    for name in ("uvicorn", "starlette", "fastapi", "aiohttp", "uvloop", "httptools"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "-"
    wrk = shutil.which("wrk") if use_wrk else None
    wrk_v = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout if wrk else ""
    return {
        "nproc": os.cpu_count() or 0,
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
        "cpu": models[0].split(":", 1)[1].strip() if models else "?",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "packages": packages,
        "wrk": " ".join(wrk_v.split()[:2]),
    }


def judge(res: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    values = {
        "added_p50_ms": res["sequential"]["added_p50_ms"],
        "cpu_vs_bare": res["throughput"]["cpu_vs_bare"],
        "added_first_p50_ms": res["streaming"]["added_first_p50_ms"],
    }
    out = []
    for key, limit in TARGETS.items():
        ok = values[key] <= limit
        # A quick run never judges: its counts are far too small.
        out.append(
            {"name": key, "limit": limit, "value": values[key], "pass": None if quick else ok}
        )
    return out


def _at_most(target: str) -> str:
    return f"<= +{TARGETS[target]:g} ms"


def lat_row(label: str, part: dict[str, Any], key: str, *target: str) -> list[str]:
    d, g, add = (part[f"{side}_{key}_ms"] for side in ("direct", "gateway", "added"))
    bare = part.get(f"bare_{key}_ms")
    if bare is None:
        return [label, f"{d:.3f}", "-", f"{g:.3f}", f"+{add:.3f} ms", *target]
    bare_add = part[f"bare_added_{key}_ms"]
    added = f"+{add:.3f} ms (bare +{bare_add:.3f})"
    return [label, f"{d:.3f}", f"{bare:.3f}", f"{g:.3f}", added, *target]


def rate_row(label: str, d: float, g: float, *target: str, bare: float | None = None) -> list[str]:
    shown = "-" if bare is None else f"{bare:.0f}"
    return [label, f"{d:.0f}", shown, f"{g:.0f}", f"x{g / d:.2f}", *target]


def render(res: dict[str, Any]) -> str:
    s, t, st, m = res["sequential"], res["throughput"], res["streaming"], res["machine"]
    names = {None: "n/a (quick)", True: "PASS", False: "FAIL"}
    verdict = {x["name"]: names[x["pass"]] for x in res["targets"]}
    runs, tool = len(t["runs"]), res["load_tool"]
    n, ns = s["requests"], st["requests"]
    table = [
        lat_row(
            f"Sequential p50 (ms, n={n})",
            s,
            "p50",
            _at_most("added_p50_ms"),
            verdict["added_p50_ms"],
        ),
        lat_row("Sequential p99 (ms)", s, "p99"),
    ]
    for i, r in enumerate(t["runs"], 1):
        table.append(
            rate_row(
                f"Throughput round {i} (req/s)",
                r["direct"]["rps"],
                r["gateway"]["rps"],
                bare=r.get("bare", {}).get("rps"),
            )
        )
    table += [
        rate_row(
            f"Throughput, best of {runs} (req/s)",
            t["direct_rps"],
            t["gateway_rps"],
            bare=t.get("bare_rps"),
        ),
        [
            f"**Relay CPU per request under load (us, all {runs} rounds)**",
            "-",
            f"{t['bare_cpu_us_per_req']:.0f}",
            f"{t['gateway_cpu_us_per_req']:.0f}",
            f"**x{t['cpu_vs_bare']:.2f} of bare**",
            f"<= {TARGETS['cpu_vs_bare']:g}x bare",
            verdict["cpu_vs_bare"],
        ],
        lat_row(
            f"Streaming first chunk p50 (ms, n={ns})",
            st,
            "first_p50",
            _at_most("added_first_p50_ms"),
            verdict["added_first_p50_ms"],
        ),
        lat_row(f"Streaming end of {TOKENS}-token stream p50 (ms)", st, "end_p50"),
    ]
    api = res["apis"]
    for name, numbers in api["apis"].items():
        label = f"Per API sequential p50 (ms, n={api['requests']}): {name}"
        table.append(lat_row(label, numbers, "p50"))
    if keys := res.get("keys"):
        for label, key in (("sequential p50", "p50"), ("stream end p50", "stream_end_p50")):
            n_keys = keys["requests"]
            table.append([f"keys.yaml (3 keys, limits on) vs none: {label} (ms, n={n_keys})",
                          f"{keys[f'plain_{key}_ms']:.3f}", "-", f"{keys[f'keyed_{key}_ms']:.3f}",
                          f"+{keys[f'added_{key}_ms']:.3f} ms"])  # fmt: skip
        table.append(rate_row(f"keys.yaml vs none: throughput, best of {len(keys['runs'])} (req/s)",
                              keys["plain_rps"], keys["keyed_rps"]))  # fmt: skip
    if off := res.get("access_log_off"):
        so, to = off["sequential"], off["throughput"]
        table.append(lat_row("Access log off: sequential p50 (ms)", so, "p50"))
        table.append(
            rate_row(
                f"Access log off: throughput, best of {runs} (req/s)",
                to["direct_rps"],
                to["gateway_rps"],
            )
        )
    cpu = " / ".join(f"{r['gateway']['gateway_cpu_us_per_req']:.0f}" for r in t["runs"])
    bare = " / ".join(f"{r['bare']['bare_cpu_us_per_req']:.0f}" for r in t["runs"])
    fake = " / ".join(f"{r['gateway']['fake_cpu_us_per_req']:.0f}" for r in t["runs"])
    kind = "QUICK smoke run (counts too small to mean much)" if res["quick"] else "full run"
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        f"## Gateway overhead: {kind}",
        "",
        f"Machine: nproc {m['nproc']} (allowed {m['cpus_allowed']}), {m['cpu']}, load average "
        f"{m['loadavg_1m_at_start']} at start (other load skews the numbers); {m['python']}; "
        f"{m['platform']}; {packages}; {m['wrk'] or 'wrk not used'}",
        "",
        "| Measurement | Direct | Bare relay | Gateway | Added / ratio | Target | Result |",
        "|---|---:|---:|---:|---:|---|---|",
        *("| " + " | ".join([*cells, "-", "-"][:7]) + " |" for cells in table),
        "",
        f"Throughput load: {tool}. Server CPU per request, round by round: gateway {cpu} us, "
        f"bare relay {bare} us, fake vLLM (gateway rounds) {fake} us (from /proc, 10 ms "
        "ticks); the ratio row divides all rounds' CPU seconds by all their requests.",
        "",
        "How: one fake vLLM (--ttft 0 --tokens-per-second 0: the upstream answers at once), "
        "one bare relay in front of it (bench/bare_relay.py: uvicorn httptools + one aiohttp "
        "session, no logic) and one gateway with default settings (access log on, written to "
        "a file), all started by this script, sharing all CPUs with the client and wrk; "
        "nothing pinned, phases one at a time. Latency and streaming: a raw-socket HTTP/1.1 "
        "client, one keep-alive connection per target, the targets alternated request by "
        "request after a warm-up (the bare relay in the sequential phase only); added = "
        "percentile - direct percentile; first chunk = first body chunk (the role event). "
        f"Throughput: {runs} rounds (direct, bare relay, gateway; reversed every other "
        "round), each shown; "
        "the best of each is compared. Per API: the same sequential method for "
        "each API; for /v1/messages, direct is the chat request the gateway sends upstream "
        "(so added includes both translations). keys.yaml rows: Direct is the gateway "
        "without keys, Gateway the same gateway with keys.yaml (three keys, rpm/tpm/"
        "max_concurrent/daily cloud tokens on, set high so nothing is refused; its streams "
        "get include_usage added and stripped), alternated the same way.",
        "",
        "Commands:",
        *(f"    {c}" for c in res["commands"]),
    ]
    if res["errors"]:
        lines += ["", f"WARNING: {res['errors']} failed or invalid responses (details in --json)."]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny counts, for a smoke test")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    p.add_argument("--requests", type=int, help="sequential requests (default 2000; quick 50)")
    p.add_argument("--streams", type=int, help="streaming requests (default 300; quick 20)")
    p.add_argument("--duration", type=float, help="seconds per load run (default 10; quick 2)")
    p.add_argument("--runs", type=int, help="throughput rounds (default 2; quick 1)")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--no-wrk", action="store_true", help="use the Python load loop instead")
    p.add_argument("--no-access-log-off", action="store_true", help="skip the extra gateway run")
    a = p.parse_args(argv)
    q = a.quick
    a.requests, a.streams = a.requests or (50 if q else 2000), a.streams or (20 if q else 300)
    a.duration, a.runs = a.duration or (2.0 if q else 10.0), a.runs or (1 if q else 2)
    a.warmup, a.stream_warmup = (10, 5) if q else (200, 30)
    a.no_access_log_off = a.no_access_log_off or q
    return a


def run(a: argparse.Namespace, tmp: Path, procs: list[Proc]) -> dict[str, Any]:
    script, keyed_script = tmp / "post.lua", tmp / "post-keyed.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(BODY, separators=(",", ":")))}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    keyed_script.write_text(
        script.read_text() + f'wrk.headers["Authorization"] = "Bearer {BENCH_KEY}"\n'
    )
    use_wrk = not a.no_wrk and shutil.which("wrk") is not None
    c, d, th = a.connections, a.duration, a.wrk_threads
    load: Load = functools.partial(python_load, secs=d, conns=c)
    keyed_load: Load = functools.partial(python_load, secs=d, conns=c, key=BENCH_KEY)
    tool = f"Python loop, {c} threads x {d:g} s (client-bound, not comparable to wrk)"
    if use_wrk:
        load = functools.partial(wrk_load, secs=d, conns=c, threads=th, script=script)
        keyed_load = functools.partial(wrk_load, secs=d, conns=c, threads=th, script=keyed_script)
        tool = f"wrk -t{th} -c{c} -d{d:g}s"
    fake = start_fake(tmp, procs)
    bare = start_bare(tmp, fake, procs)
    gw = start_gateway(tmp, fake, procs, access_log=True)
    res: dict[str, Any] = {"quick": a.quick, "machine": machine(use_wrk), "load_tool": tool}
    url = f"http://{HOST}:{{{fake.port},{bare.port},{gw.port}}}{CHAT_PATH}"
    load_cmd = f"{tool} -s post.lua {url}" if use_wrk else tool
    res["commands"] = [fake.command_line(), bare.command_line(), gw.command_line(), load_cmd]
    res["commands"] += [f"post.lua: {' '.join(script.read_text().splitlines())}"]
    log(f"sequential: {a.requests} requests to each target ...")
    res["sequential"] = phase_latency(fake, gw, a.requests, a.warmup, stream=False, bare=bare)
    log(f"throughput: {a.runs} x 3 runs of {a.duration:g} s ...")
    res["throughput"] = phase_throughput(fake, gw, load, a.runs, bare=bare)
    bare.stop()
    log(f"streaming: {a.streams} streams from each target ...")
    res["streaming"] = phase_latency(fake, gw, a.streams, a.stream_warmup, stream=True)
    per_api = max(a.requests // 4, 10)
    log(f"per API: {per_api} requests per API to each target ...")
    res["apis"] = phase_apis(fake, gw, per_api, a.warmup)
    log("keys.yaml: the same gateway with three keys, sequential and throughput ...")
    keyed = start_gateway(tmp, fake, procs, access_log=True, keys=True)
    res["commands"].insert(2, keyed.command_line() + " (keys.yaml: BENCH_KEYS in this script)")
    res["keys"] = phase_keys(gw, keyed, (load, keyed_load), a.requests, a.warmup, a.runs)
    keyed.stop()
    gw.stop()
    parts = [res["sequential"], res["throughput"], res["streaming"], res["apis"], res["keys"]]
    if not a.no_access_log_off:
        log("access log off: sequential and throughput again ...")
        quiet = start_gateway(tmp, fake, procs, access_log=False)
        res["commands"].insert(2, quiet.command_line())
        seq = phase_latency(fake, quiet, a.requests, a.warmup, stream=False)
        thr = phase_throughput(fake, quiet, load, a.runs)
        res["access_log_off"] = {"sequential": seq, "throughput": thr}
        parts += res["access_log_off"].values()
    res["errors"] = sum(p["errors"] for p in parts)
    res["targets"] = judge(res, a.quick)
    return res


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if not a.quick and not a.no_wrk and not shutil.which("wrk"):
        log("wrk is not installed: install it (`apt-get install wrk`) or run with --quick")
        return 2
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        try:
            res = run(a, Path(tmp), procs)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            log(f"FAILED: {exc}")
            return 1
        finally:
            for proc in reversed(procs):
                proc.stop()
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

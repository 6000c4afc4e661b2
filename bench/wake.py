"""How long after a woken backend starts listening is the held request answered?

Run `.venv/bin/python bench/wake.py` (or `make bench`); `--quick` for a smoke run,
`--json PATH` to keep the numbers. The gateway is a real process; its one backend is a
lazy fake vLLM the gateway starts as a process (`--startup-delay` keeps the port closed,
like vLLM loading weights). Each round stops the backend through the admin API, sends one
cold chat completion and compares, on the same host clock, the moment the response
arrived with the moment the fake opened its port (`listening_since` in `/_fake/stats`).
That difference is what the gateway adds to the backend's own start-up: noticing the
port is open (the readiness poll), the health check and relaying the request.

Target (reported, not enforced): p50 and max under 100 ms. Exit code 1 only when
something broke.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.overhead import HOST, Proc, free_port, log, ms, pct, serve_quiet

MODEL = "wake-model"
TARGET_MS = 100.0


def call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def start_gateway(tmp: Path, backend_port: int, startup_delay: float) -> Proc:
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    command = [
        "{python}", "-m", "app.sim.vllm", "--port", str(backend_port), "--model", MODEL,
        "--startup-delay", str(startup_delay), "--max-tokens", "1",
    ]  # fmt: skip
    (config / "models.yaml").write_text(
        json.dumps(
            {
                "backends": {
                    "lazy": {
                        "url": f"http://{HOST}:{backend_port}",
                        "models": [MODEL],
                        "lifecycle": "lazy",
                        "vram_mib": 1000,
                        "runtime": {"kind": "process", "command": command},
                    }
                }
            }
        )
    )
    return serve_quiet(tmp, config)


def one_round(gw: Proc, backend_port: int) -> dict[str, float]:
    status, view = call(gw.port, "POST", "/backends/lazy/stop")
    if status != 200 or view["state"] != "stopped":
        raise RuntimeError(f"stop answered {status}: {view}")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    sent = time.time()
    status, reply = call(gw.port, "POST", "/v1/chat/completions", body)
    answered = time.time()
    if status != 200 or reply.get("object") != "chat.completion":
        raise RuntimeError(f"cold request answered {status}: {reply}")
    status, stats = call(backend_port, "GET", "/_fake/stats")
    listening = stats.get("listening_since") if status == 200 else None
    if not isinstance(listening, float):
        raise RuntimeError(f"the fake did not report listening_since: {stats}")
    return {"cold_s": answered - sent, "after_listen_s": answered - listening}


def render(res: dict[str, Any]) -> str:
    a = res["after_listen"]
    verdict = "PASS" if a["max_ms"] < TARGET_MS else "MISS"
    return "\n".join(
        [
            f"Wake latency, {res['rounds']} cold requests, backend start-up delay "
            f"{res['startup_delay_s']:g} s ({res['machine']})",
            "",
            "| Measurement | p50 | max | target |",
            "|---|---:|---:|---|",
            f"| answered after the backend started listening | {a['p50_ms']:.1f} ms "
            f"| {a['max_ms']:.1f} ms | < {TARGET_MS:g} ms: {verdict} |",
            f"| whole cold request (process start + delay + above) | "
            f"{res['cold']['p50_ms']:.0f} ms | {res['cold']['max_ms']:.0f} ms | - |",
            "",
            f"Command: {res['command']}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/wake.py", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--startup-delay", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="3 rounds, a 0.3 s start-up delay")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    rounds, delay = (3, 0.3) if a.quick else (a.rounds, a.startup_delay)
    with tempfile.TemporaryDirectory(prefix="bench-wake-") as tmp:
        backend_port = free_port()
        gw: Proc | None = None
        try:
            gw = start_gateway(Path(tmp), backend_port, delay)
            results = []
            for i in range(rounds):
                results.append(one_round(gw, backend_port))
                log(f"round {i + 1}/{rounds}: +{ms(results[-1]['after_listen_s']):.1f} ms")
        except (RuntimeError, OSError, ValueError) as exc:
            log(f"FAILED: {exc}{gw.tail() if gw else ''}")
            return 1
        finally:
            if gw is not None:
                gw.stop()
    after = [r["after_listen_s"] for r in results]
    cold = [r["cold_s"] for r in results]
    res = {
        "quick": a.quick,
        "rounds": rounds,
        "startup_delay_s": delay,
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "after_listen": {"p50_ms": ms(pct(after, 50)), "max_ms": ms(max(after))},
        "cold": {"p50_ms": ms(pct(cold, 50)), "max_ms": ms(max(cold))},
        "target_ms": TARGET_MS,
        "command": f"python bench/wake.py --rounds {rounds} --startup-delay {delay:g}",
    }
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

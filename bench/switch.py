"""What a model switch costs, and what the gateway adds to it.

Run `.venv/bin/python bench/switch.py`; `--quick` for a smoke run, `--json PATH` to keep the
numbers. The gateway is a real process on a simulated 16,000 MiB GPU; its two backends are
lazy fake vLLM processes of equal priority (dev mode, sleep mode on) of 11,000 MiB each, so
they never fit together and every turn is a switch. The fake models its own waits: a cold
start waits `--startup-delay`, a wake copies its weights back at `--wake-gib-per-s`; it
reports both (`/_fake/stats`: `wake_s`, `process_started`, `listening_since`).

Phases:
1. Switches, once with `eviction: {method: stop}`, once with `{method: sleep}`: one client
   alternates streaming chat requests between the two models; each request after the
   first of each model is a switch. The fake answers at once (no modelled TTFT). Per
   switch: the time to the first body byte (TTFB), the fake's
   modelled wait (the wake, or the startup delay of a cold start) and the gateway's share:
   TTFB minus that modelled wait. A cold start also waits for the fake's Python process to
   boot (imports; no vLLM model of it): reported, and taken out in a second column.
2. Collation (sleep eviction): clients of both models send requests at once, each as soon
   as its last one is answered, with `max_hold_s` set and with `max_hold_s: 0` (a busy
   model is evicted at once, drained: a swap at every turn). Reported: switches (the
   gateway's `microscheduler_swaps_total`), the longest any request waited, and its bound
   (`max_wait_s`); every request must be answered.
3. A cancelled start (no load nobody waits for): a cold start of one model with a longer
   modelled load (`--cancel-load`), whose only client goes away 0.3 s after sending
   (closes its connection). The gateway cancels the start `start_cancel_grace_s` (2 s)
   after the client left and stops the fake. Reported: the phase and seconds the start had
   run (its `start_cancelled` event), the fake's modelled load not spent (modelled load
   minus that; the process boot before it counts as spent), and from the client leaving
   to the backend `stopped`.
4. Fair turns between keys (one model, `max_inflight: 1`, two keys of one priority): key a
   floods the backend with 100 requests at once, key b sends 5 once a's are queued. Per
   request of b, its position: the requests answered after it was sent and before its own
   answer (slots served ahead of it). Reported: b's worst and median position, and how many
   of a's were still queued when b sent (where b would stand in arrival order).

Targets (reported, not enforced): the gateway adds <= 50 ms to a sleep switch (p50 and p95);
with collation, fewer switches for the same requests and none waits past its bound; each
of b's requests within the next 12 slots. Exit code 1 only when something broke.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import contextlib

from bench.overhead import HOST, Proc, free_port, log, ms, pct, serve_quiet

MODELS = ("alpha", "beta")
GPU_MIB, MODEL_MIB, ASLEEP_MIB = 16000, 11000, 1000
TARGET_MS = 50.0
FAIR_SLOTS = 12  # each of b's requests within this many slots of its arrival
FAIR_KEYS = {"a": "sk-bench-flood-a", "b": "sk-bench-later-b"}


def call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw or b"null")
        except ValueError:
            return response.status, raw.decode(errors="replace")
    finally:
        conn.close()


def chat(
    port: int, model: str, *, stream: bool, key: str | None = None
) -> tuple[int, float, float]:
    """(status, seconds to the first body byte, seconds to the end); `key`: its secret."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": stream}  # fmt: skip
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        sent = time.monotonic()
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
        response = conn.getresponse()
        response.read(1)
        first = time.monotonic() - sent
        response.read()
        return response.status, first, time.monotonic() - sent
    finally:
        conn.close()


def fake_stats(port: int) -> dict[str, Any] | None:
    try:
        status, stats = call(port, "GET", "/_fake/stats")
    except OSError:
        return None  # stopped: no process
    return stats if status == 200 else None


class Setup:
    def __init__(self, quick: bool) -> None:
        self.startup_delay = 0.3 if quick else 2.0
        self.wake_gib_per_s = 40.0 if quick else 10.0  # 9.4 GiB of weights: 0.24 s / 0.94 s
        self.ttft = 0.05
        self.fair_ttft = 0.01 if quick else 0.02  # a's 100 answered one at a time


def start_gateway(
    tmp: Path,
    ports: dict[str, int],
    setup: Setup,
    ttft: float,
    *,
    keys: dict[str, Any] | None = None,
    **fields: Any,
) -> Proc:
    ledger = tmp / "sim-gpu"
    config = tmp / "config"
    config.mkdir(parents=True, exist_ok=True)
    backends = {}
    for name, port in ports.items():
        command = [
            "{python}", "-m", "app.sim.vllm", "--port", str(port), "--model", name,
            "--max-tokens", "2", "--ttft", str(ttft),
            "--startup-delay", str(setup.startup_delay), "--enable-sleep-mode",
            "--wake-gib-per-s", str(setup.wake_gib_per_s), "--vram-mib", str(MODEL_MIB),
            "--vram-asleep-mib", str(ASLEEP_MIB), "--sim-gpu-dir", str(ledger),
        ]  # fmt: skip
        backends[name] = {
            "url": f"http://{HOST}:{port}",
            "models": [name],
            "lifecycle": "lazy",
            "vram_mib": MODEL_MIB,
            "asleep_mib": ASLEEP_MIB,
            "runtime": {"kind": "process", "command": command,
                        "env": {"VLLM_SERVER_DEV_MODE": "1"}},
            **fields,
        }  # fmt: skip
    models = {"gpu": {"probe": "sim", "sim": {"total_mib": GPU_MIB, "ledger_dir": str(ledger)}},
              "backends": backends}  # fmt: skip
    (config / "models.yaml").write_text(json.dumps(models))
    if keys is not None:
        (config / "keys.yaml").write_text(json.dumps({"keys": keys}))
    return serve_quiet(tmp, config)


def swaps(port: int) -> float:
    status, text = call(port, "GET", "/metrics")
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"/metrics answered {status}")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("microscheduler_swaps_total{")
    )


def phase_switches(tmp: Path, setup: Setup, method: str, switches: int) -> dict[str, Any]:
    ports = {name: free_port() for name in MODELS}
    # No modelled generation time here: the switch is all there is to the first byte.
    gw = start_gateway(tmp / method, ports, setup, 0.0, eviction={"method": method, "level": 1})
    rows: list[dict[str, float]] = []
    try:
        for turn in range(switches + 2):
            name = MODELS[turn % 2]
            before = fake_stats(ports[name])
            status, first, _ = chat(gw.port, name, stream=True)
            if status != 200:
                raise RuntimeError(f"{method}: request {turn} for {name} answered {status}")
            after = fake_stats(ports[name])
            if after is None:
                raise RuntimeError(f"{method}: {name} answered but reports no stats")
            if turn < 2:
                continue  # each model's first request is its first start, not a switch
            cold = before is None or before["pid"] != after["pid"]
            if cold:
                modelled = after["startup_delay_s"]
                boot = after["listening_since"] - (after["process_started"] or 0.0)
            else:
                assert before is not None
                modelled = after["wake_s"] - before["wake_s"]
                boot = modelled
            rows.append({"ttfb_s": first, "modelled_s": modelled, "cold": float(cold),
                         "gateway_s": first - modelled, "beyond_boot_s": first - boot})  # fmt: skip
            log(f"{method} switch {turn}: ttfb {ms(first):.0f} ms, gateway "
                f"{ms(first - modelled):.1f} ms{' (cold)' if cold else ''}")  # fmt: skip
        counted = swaps(gw.port)
    finally:
        gw.stop()

    def stat(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {"p50_ms": ms(pct(values, 50)), "p95_ms": ms(pct(values, 95))}

    return {
        "method": method,
        "switches": len(rows),
        "gateway_swaps": counted,
        "cold_starts": int(sum(r["cold"] for r in rows)),
        "ttfb": stat("ttfb_s"),
        "modelled": stat("modelled_s"),
        "gateway": stat("gateway_s"),
        "beyond_boot": stat("beyond_boot_s"),
    }


def phase_collation(
    tmp: Path, setup: Setup, hold_s: float, clients: int, requests: int, max_wait_s: float
) -> dict[str, Any]:
    ports = {name: free_port() for name in MODELS}
    fields: dict[str, Any] = {"eviction": {"method": "sleep", "level": 1},
                              "max_hold_s": hold_s, "max_wait_s": max_wait_s}  # fmt: skip
    gw = start_gateway(tmp / f"hold-{hold_s:g}", ports, setup, setup.ttft, **fields)
    waits: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(model: str) -> None:
        for _ in range(requests):
            try:
                status, _, total = chat(gw.port, model, stream=False)
            except OSError as exc:
                status, total = 0, 0.0
                with lock:
                    errors.append(str(exc))
            with lock:
                waits.append(total)
                if status != 200:
                    errors.append(f"{model}: {status}")

    try:
        for name in MODELS:  # both loaded once (the second evicts the first): warm
            if chat(gw.port, name, stream=False)[0] != 200:
                raise RuntimeError(f"warm-up request for {name} failed")
        before = swaps(gw.port)
        threads = [threading.Thread(target=client, args=(MODELS[i % 2],))
                   for i in range(clients * 2)]  # fmt: skip
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=max_wait_s * requests + 60)
        wall = time.monotonic() - began
        counted = swaps(gw.port) - before
    finally:
        gw.stop()
    return {
        "max_hold_s": hold_s,
        "requests": len(waits),
        "errors": len(errors),
        "error_kinds": sorted(set(errors))[:5],
        "switches": counted,
        "wall_s": round(wall, 2),
        "max_wait_s": round(max(waits, default=0.0), 3),
        "p50_wait_s": round(pct(waits, 50), 3) if waits else 0.0,
        "bound_s": max_wait_s,
    }


def phase_cancelled(tmp: Path, setup: Setup, load_s: float) -> dict[str, Any]:
    ports = {MODELS[0]: free_port()}
    slow = Setup(quick=False)
    slow.startup_delay, slow.wake_gib_per_s = load_s, setup.wake_gib_per_s
    gw = start_gateway(tmp / "cancelled", ports, slow, 0.0)
    try:
        body = {"model": MODELS[0], "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2, "stream": True}  # fmt: skip
        conn = http.client.HTTPConnection(HOST, gw.port, timeout=0.3)
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"content-type": "application/json"})  # fmt: skip
        with contextlib.suppress(TimeoutError):
            conn.getresponse().read(1)
        conn.close()  # the client goes away while the model loads
        left = time.monotonic()
        event: dict[str, Any] | None = None
        state = ""
        while time.monotonic() - left < load_s + 30:
            status, snapshot = call(gw.port, "GET", "/status")
            if status != 200:
                raise RuntimeError(f"/status answered {status}")
            events = [e for e in snapshot["events"] if e["kind"] == "start_cancelled"]
            state = next((b["state"] for b in snapshot["backends"] if b["name"] == MODELS[0]), "")
            if events and state == "stopped":
                event = events[-1]
                break
            time.sleep(0.05)
        stopped_after = time.monotonic() - left
        if event is None:
            raise RuntimeError(f"the start was not cancelled (state {state!r})")
        fake_gone = fake_stats(ports[MODELS[0]]) is None
    finally:
        gw.stop()
    return {
        "modelled_load_s": load_s,
        "phase": event["phase"],
        "ran_s": event["seconds"],
        "not_spent_s": round(max(0.0, load_s - event["seconds"]), 2),
        "stopped_after_left_s": round(stopped_after, 2),
        "fake_stopped": fake_gone,
    }


def queued(port: int, backend: str) -> int:
    """The backend's requests waiting for a slot (`/backends`)."""
    status, body = call(port, "GET", "/backends")
    if status != 200 or not isinstance(body, dict):
        raise RuntimeError(f"/backends answered {status}")
    view = next(v for v in body["backends"] if v["name"] == backend)
    count: int = view["queued"]
    return count


def phase_fairness(tmp: Path, setup: Setup, flood: int, later: int) -> dict[str, Any]:
    """Key a floods `flood` requests, key b sends `later` once a's are queued; b's
    positions (answers to others between its sending and its own answer)."""
    ports = {name: free_port() for name in MODELS}
    keys = {name: {"key_sha256": hashlib.sha256(secret.encode()).hexdigest()}
            for name, secret in FAIR_KEYS.items()}  # fmt: skip
    fields = {"max_inflight": 1, "max_waiting": flood + later + 8}
    gw = start_gateway(tmp / "fair", ports, setup, setup.fair_ttft, keys=keys, **fields)
    model = MODELS[0]
    done: list[tuple[str, float, float, int]] = []  # (key, sent, answered, status)
    lock = threading.Lock()

    def client(key: str) -> None:
        sent = time.monotonic()
        try:
            status = chat(gw.port, model, stream=False, key=FAIR_KEYS[key])[0]
        except OSError:
            status = 0
        with lock:
            done.append((key, sent, time.monotonic(), status))

    try:
        if chat(gw.port, model, stream=False, key=FAIR_KEYS["a"])[0] != 200:  # its start
            raise RuntimeError("fairness: the warm-up request failed")
        threads = [threading.Thread(target=client, args=("a",)) for _ in range(flood)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while (ahead := queued(gw.port, model)) < flood * 0.8:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fairness: only {ahead} of a's {flood} requests queued")
            time.sleep(0.005)
        more = [threading.Thread(target=client, args=("b",)) for _ in range(later)]
        for thread in more:
            thread.start()
        for thread in threads + more:
            thread.join(timeout=120)
    finally:
        gw.stop()
    answered = sorted(t for _, _, t, _ in done)
    positions = [
        sum(1 for t in answered if sent < t < end) for key, sent, end, _ in done if key == "b"
    ]
    return {
        "flood": flood,
        "later": later,
        "queued_ahead": ahead,
        "requests": len(done),
        "errors": sum(1 for *_, status in done if status != 200),
        "worst_position": max(positions, default=-1),
        "median_position": pct([float(p) for p in positions], 50) if positions else -1.0,
        "positions": sorted(positions),
    }


def render(res: dict[str, Any]) -> str:
    s = res["setup"]
    lines = [
        f"Model switches: two lazy fakes of {MODEL_MIB} MiB on a {GPU_MIB} MiB sim GPU; "
        f"startup delay {s['startup_delay_s']:g} s, wake {s['wake_gib_per_s']:g} GiB/s "
        f"({res['machine']})",
        "",
        "| Eviction | switches | TTFB p50 / p95 | fake's modelled wait p50 | gateway's share "
        "p50 / p95 | share without the fake's process boot p50 / p95 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in res["switch_phases"]:
        lines.append(
            f"| {p['method']} | {p['switches']} | {p['ttfb']['p50_ms']:.0f} / "
            f"{p['ttfb']['p95_ms']:.0f} ms | {p['modelled']['p50_ms']:.0f} ms | "
            f"{p['gateway']['p50_ms']:.1f} / {p['gateway']['p95_ms']:.1f} ms | "
            f"{p['beyond_boot']['p50_ms']:.1f} / {p['beyond_boot']['p95_ms']:.1f} ms |"
        )
    lines += [
        "",
        "| Collation (sleep) | requests | switches | longest wait | p50 wait | bound "
        "(max_wait_s) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["collation"]:
        lines.append(
            f"| max_hold_s {c['max_hold_s']:g} | {c['requests']} | {c['switches']:.0f} | "
            f"{c['max_wait_s']:.2f} s | {c['p50_wait_s']:.2f} s | {c['bound_s']:g} s | "
            f"{c['errors']} |"
        )
    c = res["cancelled"]
    lines += [
        "",
        "| Cancelled start | modelled load | ran before the cancel (phase) | modelled load "
        "not spent | client left -> stopped | fake stopped |",
        "|---|---:|---:|---:|---:|---|",
        f"| its only client left after 0.3 s | {c['modelled_load_s']:g} s | {c['ran_s']:.2f} s "
        f"({c['phase']}) | {c['not_spent_s']:.2f} s | {c['stopped_after_left_s']:.2f} s | "
        f"{'yes' if c['fake_stopped'] else 'NO'} |",
    ]
    f = res["fairness"]
    lines += [
        "",
        "| Fair turns (max_inflight 1) | a's flood | a's queued when b sent | b's requests | "
        "b's worst position | b's median position | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| key a floods, key b after | {f['flood']} | {f['queued_ahead']} | {f['later']} | "
        f"{f['worst_position']} | {f['median_position']:g} | {f['errors']} |",
    ]
    lines += ["", "Targets (reported, not enforced):"]
    lines += [f"- {t['name']}: {t['value']} -> {t['verdict']}" for t in res["targets"]]
    lines += ["", f"Command: {res['command']}"]
    return "\n".join(lines)


def judge(res: dict[str, Any]) -> list[dict[str, Any]]:
    sleep = next(p for p in res["switch_phases"] if p["method"] == "sleep")
    held, thrash = res["collation"]
    added = sleep["gateway"]["p95_ms"]
    fewer = held["switches"] < thrash["switches"]
    cancelled = res["cancelled"]
    bounded = all(c["max_wait_s"] <= c["bound_s"] and not c["errors"] for c in res["collation"])
    fair = res["fairness"]
    turns = 0 <= fair["worst_position"] <= FAIR_SLOTS and not fair["errors"]
    return [
        {"name": "gateway's share of a sleep switch, p95 <= 50 ms", "value": f"{added:.1f} ms",
         "verdict": "PASS" if added <= TARGET_MS else "MISS"},
        {"name": "collation: fewer switches than max_hold_s 0",
         "value": f"{held['switches']:.0f} vs {thrash['switches']:.0f}",
         "verdict": "PASS" if fewer else "MISS"},
        {"name": "no request waits past max_wait_s, none refused",
         "value": f"longest {max(c['max_wait_s'] for c in res['collation']):.2f} s",
         "verdict": "PASS" if bounded else "MISS"},
        {"name": "a start nobody waits for is cancelled, its server stopped",
         "value": f"{cancelled['not_spent_s']:.2f} s of modelled load not spent",
         "verdict": "PASS" if cancelled["fake_stopped"] else "MISS"},
        {"name": f"fair turns: each of b's requests within {FAIR_SLOTS} slots of its arrival",
         "value": f"worst {fair['worst_position']} (a's queued ahead: {fair['queued_ahead']})",
         "verdict": "PASS" if turns else "MISS"},
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/switch.py", description=__doc__.split("\n")[0])
    p.add_argument("--switches", type=int, default=20)
    p.add_argument("--clients", type=int, default=2, help="per model, in the collation phase")
    p.add_argument("--requests", type=int, default=15, help="per client, collation phase")
    p.add_argument("--hold", type=float, default=2.0, help="max_hold_s of the collation phase")
    p.add_argument("--cancel-load", type=float, default=20.0,
                   help="modelled load (s) of the cancelled start")  # fmt: skip
    p.add_argument("--flood", type=int, default=100, help="key a's requests, fairness phase")
    p.add_argument("--quick", action="store_true", help="a smoke run: few switches, short waits")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    setup = Setup(a.quick)
    switches, requests, hold = (4, 4, 0.5) if a.quick else (a.switches, a.requests, a.hold)
    cancel_load = 5.0 if a.quick else a.cancel_load
    max_wait_s = 20.0
    with tempfile.TemporaryDirectory(prefix="bench-switch-") as tmp:
        try:
            phases = [phase_switches(Path(tmp), setup, m, switches) for m in ("stop", "sleep")]
            collation = [
                phase_collation(Path(tmp), setup, h, a.clients, requests, max_wait_s)
                for h in (hold, 0.0)
            ]
            cancelled = phase_cancelled(Path(tmp), setup, cancel_load)
            fairness = phase_fairness(Path(tmp), setup, a.flood, 5)
        except (RuntimeError, OSError, ValueError, KeyError) as exc:
            log(f"FAILED: {exc}")
            return 1
    res: dict[str, Any] = {
        "quick": a.quick,
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "setup": {
            "startup_delay_s": setup.startup_delay,
            "wake_gib_per_s": setup.wake_gib_per_s,
            "ttft_s": setup.ttft,
            "fair_ttft_s": setup.fair_ttft,
        },
        "switch_phases": phases,
        "collation": collation,
        "cancelled": cancelled,
        "fairness": fairness,
        "command": f"python bench/switch.py --switches {switches} --clients {a.clients} "
        f"--requests {requests} --hold {hold:g} --cancel-load {cancel_load:g} --flood {a.flood}"
        + (" --quick" if a.quick else ""),
    }
    res["targets"] = judge(res)
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per request of gateways from several source trees, beside the bare relay, in one run.

For a before/after of a change to the data plane: each tree (a checkout, or
`git archive REV | tar -x -C DIR`) serves a gateway in front of the same fake vLLM, the
bare relay (`bench.bare_relay`) beside them; wrk rounds go to each in turn (the order
reversed every round), and each process's CPU seconds come from /proc. Prints each one's
CPU per request over all rounds and its ratio to the bare relay's. A tree may carry
environment settings after `|`: `DIR|MICROSCHEDULER_ACCESS_LOG=false`.

    git archive HEAD~1 | tar -x -C /tmp/before
    .venv/bin/python bench/cpu_compare.py /tmp/before . --rounds 4 --duration 3

Needs wrk. Like `bench/overhead.py`, it measures a machine shared with whatever else runs:
compare the trees within one run, never across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.overhead import (
    BODY,
    HOST,
    MODEL,
    Proc,
    free_port,
    log,
    start_bare,
    start_fake,
    wrk_load,
)


def start_tree(tmp: Path, fake: Proc, spec: str, index: int, procs: list[Proc]) -> Proc:
    """A gateway run from the source tree `spec` names (defaults, access log on)."""
    tree, *settings = spec.split("|")
    root = Path(tree).resolve()
    config = tmp / f"config-{index}"
    config.mkdir()
    (config / "models.yaml").write_text(
        f"backends:\n  bench:\n    url: http://{HOST}:{fake.port}\n"
        f"    models: [{MODEL}]\n    runtime: {{kind: external}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCHEDULER_")}
    env |= {"MICROSCHEDULER_STATE_DIR": str(tmp / f"var-{index}"), "PYTHONPATH": str(root)}
    env |= dict(s.split("=", 1) for s in settings)
    proc = Proc.__new__(Proc)
    proc.name, proc.note, proc.log = f"{index + 1}: {spec}", "", tmp / f"gw-{index}.log"
    proc.port = free_port()
    args = ["app.cli", "serve", "--config", str(config), "--host", HOST, "--port", str(proc.port)]
    proc.cmd = [sys.executable, "-m", *args]
    with proc.log.open("wb") as out:
        proc.popen = subprocess.Popen(
            proc.cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    procs.append(proc)
    proc.wait_ready(["/health", "/ready"])
    return proc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("trees", nargs="+", help="source trees, each DIR or DIR|NAME=VALUE...")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--duration", type=float, default=3.0, help="seconds of each wrk run")
    p.add_argument("--connections", type=int, default=32)
    a = p.parse_args(argv)
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as name:
        tmp = Path(name)
        script = tmp / "post.lua"
        body = json.dumps(json.dumps(BODY, separators=(",", ":")))
        script.write_text(
            f'wrk.method = "POST"\nwrk.body = {body}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        try:
            fake = start_fake(tmp, procs)
            targets = [start_bare(tmp, fake, procs)]
            targets += [start_tree(tmp, fake, t, i, procs) for i, t in enumerate(a.trees)]
            for proc in targets:  # warm-up
                wrk_load(proc.port, 1, a.connections, 2, script)
            totals = {proc.name: [0.0, 0] for proc in targets}
            for r in range(a.rounds):
                log(f"round {r + 1} of {a.rounds} ...")
                for proc in targets if r % 2 == 0 else targets[::-1]:
                    before = proc.cpu_s()
                    res = wrk_load(proc.port, a.duration, a.connections, 2, script)
                    if res["errors"]:
                        raise RuntimeError(f"{proc.name}: {res['errors']} errors")
                    totals[proc.name][0] += proc.cpu_s() - before
                    totals[proc.name][1] += res["requests"]
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            log(f"FAILED: {exc}")
            return 1
        finally:
            for proc in reversed(procs):
                proc.stop()
    bare_cpu, bare_n = totals[targets[0].name]
    base = bare_cpu / max(bare_n, 1)
    print(
        f"wrk -t2 -c{a.connections} -d{a.duration:g}s x {a.rounds} rounds each; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print("| Server | CPU per request (us) | x bare relay | requests |")
    print("|---|---:|---:|---:|")
    for label, (cpu, n) in totals.items():
        per = cpu / max(n, 1)
        print(f"| {label} | {per * 1e6:.0f} | x{per / max(base, 1e-9):.2f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

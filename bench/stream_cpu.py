"""Gateway CPU per streamed chunk, for source trees side by side in one run.

For a before/after of the per-chunk relay path (what grows with thousands of streams):
each tree serves a gateway in front of the same fake vLLM (answering at once), and rounds
of 256 streamed chat completions of 400 tokens, 64 at a time, go to each gateway in turn
(the order reversed every round); each process's CPU seconds come from /proc. Prints each
gateway's CPU per streamed chunk (an SSE event the client read).

    git archive HEAD~1 | tar -x -C /tmp/before
    .venv/bin/python bench/stream_cpu.py /tmp/before .

Compare the trees within one run, never across runs: the machine is shared.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_compare import start_tree
from bench.overhead import HOST, MODEL, Proc, start_fake

TOKENS = 400
CONC = 64
REQS = 256


async def run(port: int) -> int:
    """Stream `REQS` answers through the gateway on `port`; the SSE events read."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": TOKENS,
        "stream": True,
    }
    chunks = 0
    sem = asyncio.Semaphore(CONC)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=CONC)) as c:

        async def one() -> None:
            nonlocal chunks
            async with (
                sem,
                c.stream("POST", f"http://{HOST}:{port}/v1/chat/completions", json=body) as r,
            ):
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        chunks += 1

        await asyncio.gather(*(one() for _ in range(REQS)))
    return chunks


def main(trees: list[str]) -> None:
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        try:
            fake = start_fake(tmp, procs)
            gws = [start_tree(tmp, fake, t, i, procs) for i, t in enumerate(trees)]
            for g in gws:
                g.wait_ready(["/health"])
            totals: dict[str, list[float]] = {g.name: [0.0, 0] for g in gws}
            for round_ in range(4):
                order = gws if round_ % 2 == 0 else list(reversed(gws))
                for g in order:
                    c0 = g.cpu_s()
                    n = asyncio.run(run(g.port))
                    totals[g.name][0] += g.cpu_s() - c0
                    totals[g.name][1] += n
            for name, (cpu, read) in totals.items():
                print(f"{name}: {cpu / read * 1e6:.1f} us CPU per chunk ({read:.0f} chunks, "
                      f"{cpu:.2f} s)")  # fmt: skip
        finally:
            for p in procs:
                p.stop()


if __name__ == "__main__":
    main(sys.argv[1:])

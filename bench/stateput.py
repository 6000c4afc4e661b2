"""How long `StateStore.put` holds the event loop: the save of a start's duration, a
learned route, a process record, a released zone (issue 35, "the loop never blocks").

Run `.venv/bin/python bench/stateput.py`: a state store in a temporary directory with 8
sections, then 50 `put()` calls timed on the loop (each save then awaited off the clock:
`settled()`). Before the saves were queued on the store's thread, `put()` waited for its
whole write (every section rewritten) on the loop.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from app.lifecycle.store import StateStore

SECTIONS = 8
PUTS = 50


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp) / "var")
        for n in range(SECTIONS):
            store.update(f"section{n}", {f"backend{i}": i * 1.5 for i in range(20)})
        blocked = []
        for n in range(PUTS):
            began = time.perf_counter()
            store.put("start_durations", {"llm": n * 0.1, "other": 2.0})
            blocked.append((time.perf_counter() - began) * 1000)
            await store.settled()
        await store.close()
    print(
        f"loop held per put: median {statistics.median(blocked):.3f} ms, "
        f"max {max(blocked):.3f} ms ({PUTS} puts, {SECTIONS} sections)"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""What a client key costs a request, in process: the gateway's per-request key work
(find the key by its hash, check the model, admit under rpm/tpm/max_concurrent, the
`x-ratelimit-*` headers, count the answer's tokens, finish) timed without any I/O.

Run `.venv/bin/python bench/keys.py` (`--quick` for a smoke run). The end-to-end effect
(the same gateway with and without keys.yaml) is `bench/overhead.py`'s keys.yaml rows.
"""

from __future__ import annotations

import argparse
import sys
import time

from prometheus_client import CollectorRegistry

from app.keys.metrics import KeyMetrics
from app.keys.ring import KeyRing
from app.settings.keys import KeysConfig

LIMITED = {"key_env": "K1", "models": ["m"], "priority": "high", "rpm": 10**9, "tpm": 10**12,
           "max_concurrent": 10**6, "daily_cloud_tokens": 10**12}  # fmt: skip


def one_request(ring: KeyRing, token: bytes) -> None:
    key = ring.anonymous or ring.identify(token)
    assert key is not None
    key.check_model("m")
    use = key.admit()
    use.headers()
    use.count("m", False, 9, 16)
    use.finish("served")


def per_request_us(ring: KeyRing, token: bytes, n: int) -> float:
    for _ in range(min(n, 1000)):
        one_request(ring, token)
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(n):
            one_request(ring, token)
        best = min(best, (time.perf_counter() - began) / n)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    n = 2000 if parser.parse_args().quick else 100_000
    environ = {"K1": "sk-1", "K2": "sk-2", "K3": "sk-3"}
    keys = KeysConfig.model_validate({"keys": {
        "bench": LIMITED,
        "family": {"key_env": "K2", "rpm": 600, "tpm": 200_000},
        "batch": {"key_env": "K3", "priority": "low", "cloud": False},
    }})  # fmt: skip
    rows = [
        ("no keys (anonymous)", KeyRing.build((), None, KeyMetrics(CollectorRegistry()), ["m"])),
        ("keys.yaml, 3 keys, every limit on", KeyRing.build(
            (), keys, KeyMetrics(CollectorRegistry()), ["m"], environ=environ)),
    ]  # fmt: skip
    print(f"| key work per request (best of 5 x {n}) | us |")
    print("|---|---:|")
    for label, ring in rows:
        print(f"| {label} | {per_request_us(ring, b'sk-1', n):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""vLLM's Prometheus metrics (V1 engine names) on a per-app registry.

Names and labels follow ``vllm/v1/metrics/loggers.py``: labels ``model_name`` and ``engine``;
counters are declared without ``_total`` (prometheus_client appends it).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.sim.engine import FakeEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


class FakeMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        reg = self.registry
        names = ["model_name", "engine"]
        lv = (model_name, "0")
        self._running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            names,
            registry=reg,
        ).labels(*lv)
        self._waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            names,
            registry=reg,
        ).labels(*lv)
        self._kv = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            names,
            registry=reg,
        ).labels(*lv)
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state",
            [*names, "sleep_state"],
            registry=reg,
        )
        self._sleep = {state: sleep.labels(*lv, state) for state in SLEEP_STATES}
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=reg
        ).labels(*lv)
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            names,
            registry=reg,
        ).labels(*lv)
        Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            names,
            registry=reg,
        ).labels(*lv)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        self.request_success = {r: success.labels(*lv, r) for r in FINISHED_REASONS}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            names,
            buckets=_TTFT_BUCKETS,
            registry=reg,
        ).labels(*lv)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            names,
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        ).labels(*lv)

    def render(self, engine: FakeEngine) -> bytes:
        """Refresh the gauges from the engine and expose everything."""
        self._running.set(engine.running)
        self._waiting.set(engine.waiting)
        self._kv.set(min(1.0, engine.running / engine.max_num_seqs))
        level = engine.sleep_level if engine.memory_sleeping else 0
        for i, state in enumerate(SLEEP_STATES):
            self._sleep[state].set(1 if i == level else 0)
        return generate_latest(self.registry)

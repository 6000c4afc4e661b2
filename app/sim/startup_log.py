"""What the fake vLLM prints while it "loads" (``--print-startup-log``), and how it fails
like vLLM's KV-cache check (``--fail-kv-cache``): vLLM 0.33's own lines, from its format
strings (each names the file of the vllm package it copies), spread over
``--startup-delay``, with tqdm bars written as tqdm writes them (``\\r`` then the bar).

Log lines carry vLLM's prefix, ``(EngineCore_DP0 pid=N) INFO 11-26 07:50:01 [file.py:line]
message`` (``vllm/logger.py`` ``_FORMAT``, ``_DATE_FORMAT = "%m-%d %H:%M:%S"``).
"""

# vLLM logs with %-format strings: they are kept as vLLM writes them.
# ruff: noqa: UP031

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from app.sim.config import FakeConfig

VERSION = "0.33.0"
ARCHITECTURE = "Qwen3ForCausalLM"
SHARDS = 4
GRAPHS = 20
WEIGHTS_GIB = 7.63
KV_GIB = 10.45
KV_TOKENS = 76_096
GRAPH_GIB = 0.54
# --fail-kv-cache: the KV cache vLLM found, and what one max-length request needs.
FAIL_AVAILABLE_GIB = 1.2
FAIL_NEEDED_GIB = 4.0

# `model_executor/model_loader/weight_utils.py:842`: _BAR_FORMAT (ends with a newline).
SHARD_BAR = "{desc}: {percentage:3.0f}% Completed | {n}/{total} [00:0{n}<00:00,  1.52it/s]\n"


class StartupLog:
    def __init__(self, model: str, port: int, max_model_len: int, out: TextIO | None = None):
        self._model = model
        self._port = port
        self._max_model_len = max_model_len
        self._out = out or sys.stdout
        self._pid = os.getpid()

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()

    def _log(self, process: str, level: str, where: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self._write(f"({process} pid={self._pid}) {level} {stamp} [{where}] {message}\n")

    def engine(self, where: str, message: str, level: str = "INFO") -> None:
        self._log("EngineCore_DP0", level, where, message)

    def api(self, where: str, message: str, level: str = "INFO") -> None:
        self._log("APIServer", level, where, message)

    def _compile_cache(self) -> tuple[str, bool]:
        """vLLM's compile cache for this model, and whether it is warm. Only where
        `VLLM_CACHE_ROOT` says (the fake writes nowhere else): its first start fills
        `torch_compile_cache/<hash>` there, the next ones load from it
        (vllm/compilation/backends.py:1096). Without it: always a miss."""
        root = os.environ.get("VLLM_CACHE_ROOT")
        key = hashlib.sha256(repr((self._model, self._max_model_len)).encode()).hexdigest()[:10]
        if not root:
            return os.path.join(
                os.path.expanduser("~/.cache/vllm"), "torch_compile_cache", key
            ), False
        cache_dir = os.path.join(root, "torch_compile_cache", key, "rank_0_0", "backbone")
        marker = os.path.join(cache_dir, "vllm_compile_cache.py")
        warm = os.path.exists(marker)
        if not warm:
            os.makedirs(cache_dir, exist_ok=True)
            with open(marker, "w", encoding="utf-8") as out:
                out.write("# the fake vLLM's compile cache\n")
        return cache_dir, warm

    def steps(self, *, fail_kv_cache: bool) -> list[Callable[[], None]]:
        """The lines in order, one step each (a bar's update is a step)."""
        steps: list[Callable[[], None]] = [
            # entrypoints/common/startup.py:17
            lambda: self.api(
                "startup.py:27",
                "vLLM server version %s, serving model %s" % (VERSION, self._model),
            ),
            # entrypoints/common/startup.py:96 (a dict of the flags given)
            lambda: self.api(
                "startup.py:96",
                "non-default args: %s"
                % {
                    "model_tag": self._model,
                    "port": self._port,
                    "model": self._model,
                    "max_model_len": self._max_model_len,
                },
            ),
            # config/model.py:744
            lambda: self.api("model.py:744", "Resolved architecture: %s" % ARCHITECTURE),
            # v1/engine/core.py:140 (config/vllm.py:2809 VllmConfig.__str__, its start)
            lambda: self.engine(
                "core.py:140",
                "Initializing a V1 LLM engine (v%s) with config: %s"
                % (
                    VERSION,
                    f"model={self._model!r}, speculative_config=None, "
                    f"tokenizer={self._model!r}, skip_tokenizer_init=False, "
                    f"tokenizer_mode=auto, revision=None, tokenizer_revision=None, "
                    f"trust_remote_code=False, dtype=torch.bfloat16, "
                    f"max_seq_len={self._max_model_len}, download_dir=None",
                ),
            ),
            # v1/worker/gpu_model_runner.py:4979
            lambda: self.engine(
                "gpu_model_runner.py:4979", "Starting to load model %s..." % self._model
            ),
        ]
        desc = "Loading safetensors checkpoint shards"  # weight_utils.py:1130
        for n in range(SHARDS + 1):
            pct = 100 * n / SHARDS
            bar = SHARD_BAR.format(desc=desc, percentage=pct, n=n, total=SHARDS)
            steps.append(functools.partial(self._write, "\r" + bar))
        steps += [
            # model_executor/model_loader/default_loader.py:507
            lambda: self.engine(
                "default_loader.py:507", "Loading weights took %.2f seconds" % 3.21
            ),
            # v1/worker/gpu_model_runner.py:5089
            lambda: self.engine(
                "gpu_model_runner.py:5089",
                "Model loading took %s GiB memory and %.6f seconds" % (WEIGHTS_GIB, 3.912345),
            ),
        ]
        # compilation/monitor.py:40, backends.py:1125 (its cache), backends.py:1188, the
        # graph loaded from the cache (backends.py:310) or compiled and stored (:401, :417),
        # then compilation/monitor.py:62 (its message from :20): the profiling run compiles.
        cache_dir, warm = self._compile_cache()
        compile_range = "(1, %d)" % self._max_model_len  # config/utils.py:426 Range.__str__
        steps += [
            lambda: self.engine("monitor.py:40", "%sStarting torch.compile" % ""),
            lambda: self.engine(
                "backends.py:1125",
                "%sUsing cache directory: %s for vLLM's torch.compile" % ("", cache_dir),
            ),
            lambda: self.engine(
                "backends.py:1188", "%sDynamo bytecode transform time: %.2f s" % ("", 4.37)
            ),
        ]
        if warm:
            steps.append(
                lambda: self.engine(
                    "backends.py:310",
                    "%sDirectly load the compiled graph(s) for compile range %s from the "
                    "cache, took %.3f s" % ("", compile_range, 0.412),
                )
            )
        else:
            steps += [
                lambda: self.engine(
                    "backends.py:401",
                    "%sCache the graph of compile range %s for later use" % ("", compile_range),
                ),
                lambda: self.engine(
                    "backends.py:417",
                    "%sCompiling a graph for compile range %s takes %.2f s"
                    % ("", compile_range, 6.81),
                ),
            ]
        compile_s = 5.02 if warm else 11.52
        steps.append(
            lambda: self.engine(
                "monitor.py:62", "%storch.compile took %.2f s in total" % ("", compile_s)
            )
        )
        if fail_kv_cache:
            return [*steps, *self._kv_failure()]
        steps += [
            # v1/worker/gpu_worker.py:773
            lambda: self.engine("gpu_worker.py:773", "Available KV cache memory: %s GiB" % KV_GIB),
            # v1/core/kv_cache_utils.py:1148 (the numbers with thousands separators)
            lambda: self.engine(
                "kv_cache_utils.py:1148",
                "%s KV cache size: %s tokens, Maximum concurrency for %s "
                "tokens per request: %.2fx"
                % (
                    "GPU",
                    f"{KV_TOKENS:,}",
                    f"{self._max_model_len:,}",
                    KV_TOKENS / self._max_model_len,
                ),
            ),
        ]
        # v1/worker/gpu_model_runner.py:6592: tqdm's default bar, "\r" and no newline until
        # it closes.
        desc = "Capturing CUDA graphs ({}, {})".format("mixed prefill-decode", "PIECEWISE")
        for n in range(GRAPHS + 1):
            pct = 100 * n / GRAPHS
            done = "█" * (n // 2)
            bar = f"{desc}: {pct:3.0f}%|{done:<10}| {n}/{GRAPHS} [00:01<00:00, 25.31it/s]"
            steps.append(functools.partial(self._write, "\r" + bar))
        steps += [
            lambda: self._write("\n"),
            # v1/worker/gpu_model_runner.py:6517
            lambda: self.engine(
                "gpu_model_runner.py:6517",
                "Graph capturing finished in %.0f secs, took %.2f GiB" % (2.0, GRAPH_GIB),
            ),
            # v1/engine/core.py:413
            lambda: self.engine(
                "core.py:413",
                "init engine (profile, create kv cache, warmup model) took %.2f s" % 9.87,
            ),
            # entrypoints/launchers/api_server/entry.py:139
            lambda: self.api(
                "entry.py:139", "Starting vLLM server on %s" % f"http://127.0.0.1:{self._port}"
            ),
        ]
        return steps

    def _kv_failure(self) -> list[Callable[[], None]]:
        """vLLM's KV-cache check failing (v1/core/kv_cache_planning.py:78), as the engine
        core logs it (v1/engine/core.py:1584) and the API server ends
        (v1/engine/utils.py:1474)."""
        error = (
            f"To serve at least one request with the model's max seq len "
            f"({self._max_model_len}), ({FAIL_NEEDED_GIB} GiB KV "
            f"cache is needed, which is larger than the available KV cache "
            f"memory ({FAIL_AVAILABLE_GIB} GiB). Based on the available memory, the estimated "
            f"maximum model length is {int(self._max_model_len * FAIL_AVAILABLE_GIB / 4)}. "
            f"Try increasing `gpu_memory_utilization` (which also controls "
            f"CPU memory on the CPU backend) or decreasing `max_model_len` "
            f"when initializing the engine. "
            f"See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
            f"for more details."
        )
        prefix = f"(EngineCore_DP0 pid={self._pid}) "
        traceback = [
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.12/site-packages/vllm/v1/core/kv_cache_planning.py", '
            "line 78, in _check_enough_kv_cache_memory",
            "    raise ValueError(",
            f"ValueError: {error}",
        ]
        return [
            lambda: self.engine(
                "gpu_worker.py:773", "Available KV cache memory: %s GiB" % FAIL_AVAILABLE_GIB
            ),
            lambda: self.engine("core.py:1584", "EngineCore failed to start.", level="ERROR"),
            lambda: self._write("".join(prefix + line + "\n" for line in traceback)),
            lambda: self.api(
                "launcher.py:0",
                "RuntimeError: Engine core initialization failed. "
                "See root cause above. Failed core proc(s): {}",
                level="ERROR",
            ),
        ]


async def play(steps: list[Callable[[], None]], over_s: float, stop: asyncio.Event) -> bool:
    """Run the steps spread evenly over `over_s`; False when `stop` was set first."""
    pause = over_s / max(1, len(steps))
    for step in steps:
        step()
        if pause > 0:
            try:
                await asyncio.wait_for(stop.wait(), pause)
            except TimeoutError:
                continue
            return False
        if stop.is_set():
            return False
    return True


def add_startup_log_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--print-startup-log", action="store_true",
        help="print vLLM 0.33's start-up lines (load phases, tqdm bars) over --startup-delay",
    )  # fmt: skip
    parser.add_argument(
        "--fail-kv-cache", action="store_true",
        help="fail like vLLM's KV-cache check: its start-up lines, the error, then exit 1",
    )  # fmt: skip


async def print_startup(config: FakeConfig, stop: asyncio.Event) -> None:
    """The start-up lines over `startup_delay` (port closed); exits 1 after the KV-cache
    failure (`fail_kv_cache`) and 0 when stopped meanwhile, as the fake does."""
    log = StartupLog(config.models[0], config.port, config.max_model_len)
    if not await play(log.steps(fail_kv_cache=config.fail_kv_cache), config.startup_delay, stop):
        raise SystemExit(0)
    if config.fail_kv_cache:
        raise SystemExit(1)

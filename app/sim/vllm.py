"""A fast, faithful stand-in for vLLM's OpenAI-compatible server (``vllm serve``).

Run ``python -m app.sim.vllm --port 8001 --model my-model``. It follows vLLM 0.33's source
(each behaviour names the vLLM file it copies): with ``--task`` only that task's routes
(``app.sim.routes``), without it every task's at once (a permissive mode for tests). It
serves ``/health``, ``/version``, ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/messages`` (+ ``/count_tokens``; ``app.sim.messages``),
``/v1/responses`` (+ ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``;
``app.sim.responses``; kept only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``, as vLLM),
``/tokenize``, ``/detokenize``,
``/rerank`` (``/v1``, ``/v2``), ``/score`` (``/v1``), ``/pooling``, ``/classify``
(``app.sim.pooling``), ``/v1/audio/transcriptions``, ``/v1/audio/translations``
(``app.sim.audio``) and ``/metrics`` in vLLM's shapes, plus ``/v1/audio/speech`` in OpenAI's
(vLLM does not serve it; vLLM-Omni-like servers do); ``/sleep``, ``/wake_up`` (``tags``
repeatable), ``/is_sleeping``, ``/collective_rpc`` (``reload_weights`` only) and
``/reset_prefix_cache`` only with ``VLLM_SERVER_DEV_MODE=1``. After ``/sleep?level=2`` the
weights are gone until ``reload_weights``: generation then answers 500 (a real vLLM answers
garbage). Test controls: ``POST /_fake/faults`` (same options as the fault flags,
snake_case, null resets one), ``GET /_fake/faults``, ``GET``/``DELETE /_fake/stats``. Like
vLLM, the port refuses connections until ``--startup-delay`` has passed. Client disconnects
cancel the handler and count as aborts.

With ``--sim-gpu-dir DIR --vram-mib N`` it reports its GPU footprint to the simulated GPU's
ledger (``app.gpu.ledger``) from the moment loading begins, like vLLM, which allocates
weights and KV cache before ``/health`` answers; ``--vram-asleep-mib`` while asleep (level 1
or 2; default N/8: the CUDA context and graphs stay, 0.5-6 GiB on real GPUs); entry
removed on clean shutdown (see ``app.sim.vram``). ``--sleep-leak-mib`` and
``--wake-fail-after`` model vLLM's sleep leak and a failing wake (``app.sim.sleep_mode``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from app.sim.audio import AudioApi
from app.sim.config import FakeConfig
from app.sim.devices import VISIBLE, gpu_list, placed_gpus
from app.sim.generation import GenerationApi
from app.sim.messages import MessagesApi
from app.sim.metrics import CONTENT_TYPE
from app.sim.pooling import PoolingApi
from app.sim.responses import ResponsesApi
from app.sim.routes import TASKS, RouteTable, api_key_middleware
from app.sim.sleep_mode import SleepMode
from app.sim.startup_log import add_startup_log_options, print_startup
from app.sim.state import error_response, json_response, process_started
from app.sim.text import ApiError, dumps, validation_error
from app.sim.tools import TOOL_PARSERS

__all__ = [
    "FakeConfig",
    "FakeVllmServer",
    "build_app",
    "main",
    "make_runner",
    "parse_args",
    "serve",
]


class FakeVllm(SleepMode):
    """The non-generation endpoints: health, models, metrics, sleep mode, LoRA, test controls."""

    routes: RouteTable  # set by build_app
    _openapi_ready_at: float | None = None  # when the schema is built (--openapi-delay)

    # --- plain endpoints ---------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=self.faults.health_status or 200)

    async def version(self, request: web.Request) -> web.StreamResponse:
        self.record(request, None)
        return json_response(dumps({"version": self.config.version}))

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        self.record(request, None)
        created = int(time.time())
        cards = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.models[0],
                "parent": None,
                "max_model_len": self.config.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.models
        ]
        # vllm/entrypoints/openai/models/serving.py show_available_models: adapters after
        # the base models, `root` their path, `parent` the base model, no max_model_len
        cards += [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": path,
                "parent": self.models[0],
                "max_model_len": None,
                "permission": cards[0]["permission"],
            }
            for name, path in self.loras.items()
        ]
        return json_response(dumps({"object": "list", "data": cards}))

    # --- LoRA (VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 only) -------------------------------------

    async def _lora_body(self, request: web.Request, fields: tuple[str, ...]) -> dict[str, Any]:
        body = await self.parse_body(request)
        for name in fields:
            if name not in body:
                raise validation_error([name], "missing", "Field required")
            if not isinstance(body[name], str):
                raise validation_error([name], "string_type", "Input should be a valid string")
        return body

    async def load_lora_adapter(self, request: web.Request) -> web.StreamResponse:
        """vllm/entrypoints/openai/models/serving.py ``load_lora_adapter``: the fake loads
        any path (vLLM reads the adapter from it); a plain-text 200 as vLLM's."""
        try:
            body = await self._lora_body(request, ("lora_name", "lora_path"))
        except ApiError as err:
            return error_response(err)
        name, path = body["lora_name"], body["lora_path"]
        if not name or not path:
            msg = "Both 'lora_name' and 'lora_path' must be provided."
            return error_response(ApiError(400, msg, "InvalidUserInput"))
        if name in self.models:
            msg = f"The lora adapter '{name}' conflicts with a served base model."
            return error_response(ApiError(400, msg, "InvalidUserInput"))
        if not body.get("load_inplace") and name in self.loras:
            msg = (
                f"The lora adapter '{name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True."
            )
            return error_response(ApiError(400, msg, "InvalidUserInput"))
        self.loras[name] = path
        return web.Response(body=f"Success: LoRA adapter '{name}' added successfully.".encode())

    async def unload_lora_adapter(self, request: web.Request) -> web.StreamResponse:
        """vllm/entrypoints/openai/models/serving.py ``unload_lora_adapter``."""
        try:
            body = await self._lora_body(request, ("lora_name",))
        except ApiError as err:
            return error_response(err)
        name = body["lora_name"]
        if not name:
            msg = "'lora_name' needs to be provided to unload a LoRA adapter."
            return error_response(ApiError(400, msg, "InvalidUserInput"))
        if name not in self.loras:
            msg = f"The lora adapter '{name}' cannot be found."
            return error_response(ApiError(404, msg, "NotFoundError"))
        del self.loras[name]
        return web.Response(body=f"Success: LoRA adapter '{name}' removed successfully.".encode())

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        body = self.metrics.render(self.engine)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        self.record(request, None)
        return await self.routes.fallback(request)

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        """The schema; the first answer `--openapi-delay` late, as FastAPI builds vLLM's
        on the first call (``fastapi/applications.py`` ``openapi()``, then cached). vLLM
        does it on its event loop, holding every other request meanwhile; the fake waits
        without holding them (in process, its loop is the tests')."""
        loop = asyncio.get_running_loop()
        if self._openapi_ready_at is None:
            self._openapi_ready_at = loop.time() + self.config.openapi_delay
        wait = self._openapi_ready_at - loop.time()  # a call during the build waits for it
        if wait > 0:
            await asyncio.sleep(wait)
        return json_response(self.routes.openapi())

    # --- test controls -----------------------------------------------------------------------

    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        return json_response(dumps(self.faults.as_dict()))

    async def set_faults(self, request: web.Request) -> web.StreamResponse:
        try:
            self.faults.update_json(await request.read())
        except ValueError as exc:
            return error_response(ApiError(400, str(exc)))
        return json_response(dumps(self.faults.as_dict()))

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        return json_response(
            dumps(
                {
                    "requests": list(stats.requests),
                    "completed": stats.completed,
                    "aborted": stats.aborted,
                    "failed": stats.failed,
                    "dropped": stats.dropped,
                    "in_flight": stats.in_flight,
                    "running": self.engine.running,
                    "waiting": self.engine.waiting,
                    "listening_since": self.listening_since,
                    "process_started": self.process_started,
                    "startup_delay_s": self.config.startup_delay,
                    "wakes": stats.wakes,
                    "wake_s": stats.wake_s,
                    "pid": os.getpid(),
                    "vram_mib": self.vram.held_mib,
                    "vram_gpus": list(self.vram.gpus),
                    "vram_ledger_file": self.vram.ledger_file,
                }
            )
        )

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        self.stats.reset()
        return await self.get_stats(request)

    async def on_shutdown(self, app: web.Application) -> None:
        self.cancel_all()
        await self.vram.stop()


FAKE_VLLM_KEY = web.AppKey("fake_vllm", FakeVllm)


def _env_flag(value: bool | None, name: str) -> bool:
    return os.environ.get(name, "0") == "1" if value is None else value


def build_app(config: FakeConfig) -> web.Application:
    """The aiohttp application; serve it with ``handler_cancellation=True`` (see ``serve``).

    Routes as vLLM 0.33 registers them (``app.sim.routes``): the task's, the dev ones with
    ``VLLM_SERVER_DEV_MODE=1``, the LoRA ones with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``."""
    fake = FakeVllm(config)
    dev_mode = _env_flag(config.dev_mode, "VLLM_SERVER_DEV_MODE")
    lora = _env_flag(config.allow_runtime_lora, "VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    task = config.task
    middlewares = [api_key_middleware(config.api_key)] if config.api_key else []
    app = web.Application(client_max_size=64 * 1024**2, middlewares=middlewares)
    app[FAKE_VLLM_KEY] = fake
    app.on_shutdown.append(fake.on_shutdown)
    table = RouteTable(app)
    fake.routes = table
    add = table.add
    # vllm/entrypoints/serve/__init__.py register_vllm_serve_api_routers: every server
    add("GET", "/health", fake.health)
    add("GET", "/version", fake.version)
    add("GET", "/metrics", fake.metrics_endpoint, in_schema=False)  # a mount in vLLM
    pooling = PoolingApi(fake)
    add("POST", "/tokenize", pooling.tokenize, json_only=True)
    add("POST", "/detokenize", pooling.detokenize, json_only=True)
    if lora:  # vllm/entrypoints/serve/lora/api_router.py attach_router
        add("POST", "/v1/load_lora_adapter", fake.load_lora_adapter, json_only=True)
        add("POST", "/v1/unload_lora_adapter", fake.unload_lora_adapter, json_only=True)
    add("GET", "/v1/models", fake.list_models)  # vllm/entrypoints/openai/models/api_router.py
    if dev_mode:  # vllm/entrypoints/serve/dev/{cache,rpc,sleep}/api_router.py
        add("POST", "/reset_prefix_cache", fake.reset_prefix_cache)
        add("POST", "/collective_rpc", fake.collective_rpc)
        add("POST", "/sleep", fake.sleep)
        add("POST", "/wake_up", fake.wake_up)
        add("GET", "/is_sleeping", fake.is_sleeping)
    gen = GenerationApi(fake)
    if task in (None, "generate"):  # vllm/entrypoints/generate/api_router.py
        add("POST", "/v1/chat/completions", gen.chat_completions, json_only=True)
        store = _env_flag(config.responses_store, "VLLM_ENABLE_RESPONSES_API_STORE")
        responses = ResponsesApi(fake, gen, store=store)  # .../openai/responses/api_router.py
        add("POST", "/v1/responses", responses.create, json_only=True)
        add("GET", "/v1/responses/{response_id}", responses.retrieve)
        add("POST", "/v1/responses/{response_id}/cancel", responses.cancel)
        if task is None:  # OpenAI's, not vLLM's: the permissive mode only
            add("DELETE", "/v1/responses/{response_id}", responses.delete)
        add("POST", "/v1/completions", gen.completions, json_only=True)
        messages = MessagesApi(fake, gen)  # vllm/entrypoints/anthropic/api_router.py
        add("POST", "/v1/messages", messages.create, json_only=True)
        add("POST", "/v1/messages/count_tokens", messages.count_tokens, json_only=True)
    audio = AudioApi(fake, gen)
    if task in (None, "transcription"):  # vllm/entrypoints/speech_to_text/factories.py
        add("POST", "/v1/audio/transcriptions", audio.transcriptions)
        add("POST", "/v1/audio/translations", audio.translations)
    if task is None:  # OpenAI's; vLLM does not serve it (vLLM-Omni-like servers do)
        add("POST", "/v1/audio/speech", audio.speech)
    # vllm/entrypoints/pooling/factories.py register_pooling_api_routers
    if task in (None, "embed", "classify"):
        add("POST", "/pooling", pooling.pooling, json_only=True)
    if task in (None, "classify"):
        add("POST", "/classify", pooling.classify, json_only=True)
    if task in (None, "embed"):
        add("POST", "/v1/embeddings", gen.embeddings, json_only=True)
    # vllm/entrypoints/pooling/utils.py enable_scoring_api
    if task in (None, "embed") or (task == "classify" and config.num_labels == 1):
        for path in ("/score", "/v1/score"):
            add("POST", path, pooling.score, json_only=True)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            add("POST", path, pooling.rerank, json_only=True)
    if not config.disable_fastapi_docs:  # vllm/entrypoints/launchers/app.py build_app
        add("GET", "/openapi.json", fake.openapi, in_schema=False)
    add("GET", "/_fake/faults", fake.get_faults, in_schema=False)
    add("POST", "/_fake/faults", fake.set_faults, in_schema=False)
    add("GET", "/_fake/stats", fake.get_stats, in_schema=False)
    add("DELETE", "/_fake/stats", fake.reset_stats, in_schema=False)
    app.router.add_route("*", "/{tail:.*}", fake.not_found)
    return app


def make_runner(app: web.Application) -> web.AppRunner:
    """A runner with client-disconnect cancellation and no access log."""
    return web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)


class FakeVllmServer:
    """The fake server inside the current event loop (for tests): ``async with``."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig(port=0)
        self.app = build_app(self.config)
        self.fake = self.app[FAKE_VLLM_KEY]
        self._runner = make_runner(self.app)
        self.url = ""

    async def start(self) -> str:
        """Load (report the GPU footprint, no delay here) and listen."""
        self.fake.vram.start(self.config.port or None)
        await self._runner.setup()
        # vLLM listens with uvicorn's backlog (2048; `vllm/entrypoints/launchers/launcher.py`
        # passes `config.backlog` to `listen`), not aiohttp's 128.
        site = web.TCPSite(
            self._runner, self.config.host, self.config.port, backlog=self.config.backlog
        )
        await site.start()
        self.fake.listening_since = time.time()  # wall clock: compared across processes
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner.server is not None:  # set up
            await self._runner.cleanup()
        await self.fake.vram.stop()

    async def __aenter__(self) -> FakeVllmServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _log(message: str) -> None:
    print(f"INFO:     [fake-vllm pid={os.getpid()}] {message}", file=sys.stderr, flush=True)


async def serve(config: FakeConfig) -> None:
    """Wait ``startup_delay`` (port closed), serve until SIGTERM/SIGINT, shut down quickly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if config.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = FakeVllmServer(config)
    server.fake.process_started = process_started()
    vram = server.fake.vram
    try:
        vram.start(config.port or None)  # vLLM allocates while loading, before /health
    except OSError as exc:
        _log(f"cannot write the sim GPU ledger in {config.sim_gpu_dir}: {exc}")
        raise SystemExit(1) from None
    try:
        if vram.enabled:
            gpus = ",".join(map(str, vram.gpus))
            _log(f"reporting vram={vram.held_mib}MiB gpus={gpus} ledger={vram.ledger_file}")
        if config.print_startup_log or config.fail_kv_cache:
            await print_startup(config, stop)  # as vLLM 0.33 does, or its KV-cache failure
        elif config.startup_delay > 0:
            _log(f"loading (startup delay {config.startup_delay:g}s, port closed)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.startup_delay)
        if stop.is_set():
            _log("stopped before startup completed")
            return
        try:
            await server.start()
        except OSError as exc:
            _log(f"cannot listen on {config.host}:{config.port}: {exc}")
            raise SystemExit(1) from None
        _log(f"listening on {server.url} models={','.join(server.fake.models)}")
        await stop.wait()
        _log("shutting down")
    finally:
        await server.stop()  # removes the ledger entry


def _non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def parse_args(argv: list[str] | None = None) -> FakeConfig:
    p = argparse.ArgumentParser(prog="python -m app.sim.vllm", description=__doc__)
    nn_int, nn_float = _non_negative(int), _non_negative(float)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=nn_int, default=8000)
    p.add_argument(
        "--backlog", type=nn_int, default=2048,
        help="connections the kernel queues before accept (uvicorn's default, as vLLM's)",
    )  # fmt: skip
    p.add_argument(
        "--model", "--served-model-name", dest="models", nargs="+", action="extend",
        metavar="NAME", help="served model name(s); repeatable (default: fake-model)",
    )  # fmt: skip
    p.add_argument("--startup-delay", type=nn_float, default=0.0, metavar="S")
    add_startup_log_options(p)
    p.add_argument("--ttft", type=nn_float, default=0.0, metavar="S")
    p.add_argument("--tokens-per-second", type=nn_float, default=0.0, metavar="R")
    p.add_argument("--max-tokens", type=nn_int, default=16)
    p.add_argument(
        "--max-model-len", type=nn_int, default=8192, metavar="N",
        help="context length, reported in /v1/models; as vLLM 0.33: prompt + max_tokens "
        "beyond it is clamped, max_tokens > N alone is a 400 (default 8192)",
    )  # fmt: skip
    p.add_argument(
        "--eos-after", type=nn_int, metavar="N",
        help="end each answer after N tokens (finish_reason stop) as a real model ends at its "
        "end-of-sequence token; without it an answer fills max_tokens (finish_reason length)",
    )  # fmt: skip
    p.add_argument("--max-num-seqs", type=nn_int, default=256)
    p.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
        help="as vLLM's: with priority, requests beyond --max-num-seqs start by their "
        "`priority` (lower first), then arrival; with fcfs `priority` is ignored (vLLM 0.33)",
    )  # fmt: skip
    p.add_argument(
        "--task", choices=TASKS,
        help="the model's task, as vLLM's supported tasks: only its routes are served "
        "(default: the fake's permissive mode, every task's routes at once)",
    )  # fmt: skip
    p.add_argument(
        "--num-labels", type=nn_int, default=2, metavar="N",
        help="labels of a --task classify model; 1 also serves /score and /rerank (default 2)",
    )  # fmt: skip
    p.add_argument(
        "--api-key", nargs="+", action="extend", metavar="KEY",
        help="as vLLM's: Bearer KEY required on /v1, /v2, /inference and /cohere paths only",
    )  # fmt: skip
    p.add_argument(
        "--disable-fastapi-docs", action="store_true",
        help="as vLLM's: no /openapi.json (the fake serves no /docs pages either)",
    )  # fmt: skip
    p.add_argument(
        "--openapi-delay", type=nn_float, default=0.5, metavar="S",
        help="the first GET /openapi.json answers S seconds late, as FastAPI builds vLLM's "
        "schema on the first call (0.6 s or more on a real server); later ones at once "
        "(default 0.5)",
    )  # fmt: skip
    p.add_argument(
        "--enable-auto-tool-choice", action="store_true",
        help="as vLLM's, with --tool-call-parser: tool calls; without both, a request with "
        "tools and tool_choice auto (their default), required or named is a 400",
    )  # fmt: skip
    p.add_argument(
        "--tool-call-parser", metavar="NAME",
        help="as vLLM's: one of vLLM 0.33's parser names (hermes, llama3_json, mistral, ...); "
        "the fake's calls are the same whichever",
    )  # fmt: skip
    p.add_argument("--embedding-dim", type=nn_int, default=8)
    p.add_argument("--fail-status", type=nn_int, metavar="CODE")
    p.add_argument("--fail-count", type=nn_int, metavar="N")
    p.add_argument("--drop-after", type=nn_int, metavar="N")
    p.add_argument("--stall-after", type=nn_int, metavar="N")
    p.add_argument("--stall-before-headers", action="store_true")
    p.add_argument("--health-status", type=nn_int, metavar="CODE")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--version-string", dest="version", default="0.0.0-fake")
    p.add_argument(
        "--vram-mib", type=nn_int, default=0, metavar="N",
        help="GPU footprint while awake, reported from the start of loading (default 0: none)",
    )  # fmt: skip
    p.add_argument(
        "--vram-asleep-mib", type=nn_int, metavar="N",
        help="footprint while asleep at level 1 or 2 (default: --vram-mib / 8; real vLLM "
        "keeps its CUDA context and graphs, 0.5-6 GiB)",
    )  # fmt: skip
    p.add_argument(
        "--sim-gpu-dir", metavar="PATH",
        help="the simulated GPU's ledger directory to report to (default: report nothing)",
    )  # fmt: skip
    p.add_argument(
        "--gpu", dest="gpus", type=gpu_list, action="extend", metavar="N",
        help="GPU index(es) the footprint is on, each in full; repeatable or comma list "
        "(default: the first --tensor-parallel-size of CUDA_VISIBLE_DEVICES, else from 0)",
    )  # fmt: skip
    p.add_argument(
        "--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
        help="vLLM's flag: the GPUs one instance spreads over (each holds --vram-mib)",
    )  # fmt: skip
    p.add_argument(
        "--enable-sleep-mode", action="store_true",
        help="vLLM's flag; accepted (the fake's sleep mode needs VLLM_SERVER_DEV_MODE=1 only)",
    )  # fmt: skip
    p.add_argument(
        "--wake-gib-per-s", type=nn_float, default=0.0, metavar="R",
        help="model a wake's time: the weights copied back at R GiB/s by a level-1 /wake_up "
        "and read again by a level-2 reload_weights, reported in /_fake/stats (default 0: "
        "instant)",
    )  # fmt: skip
    p.add_argument(
        "--weights-mib", type=nn_int, metavar="N",
        help="the weights' size for --wake-gib-per-s (default: what a sleep frees, "
        "--vram-mib minus the asleep footprint)",
    )  # fmt: skip
    p.add_argument(
        "--sleep-leak-mib", type=nn_int, default=0, metavar="N",
        help="model vLLM's sleep leak (#21336): each sleep/wake cycle leaves N MiB more held "
        "while asleep, up to --vram-mib (default 0: none)",
    )  # fmt: skip
    p.add_argument(
        "--wake-fail-after", type=nn_int, metavar="K",
        help="model a bad wake (vLLM #50011, #48680): after K sleep/wake cycles every "
        "/wake_up answers 500 as vLLM does and the server stays asleep (default: never)",
    )  # fmt: skip
    ns = p.parse_args(argv)
    if ns.fail_count is not None and ns.fail_status is None:
        p.error("--fail-count requires --fail-status")
    for name in ("fail_status", "health_status"):
        value = getattr(ns, name)
        if value is not None and not 100 <= value <= 599:
            p.error(f"--{name.replace('_', '-')} must be an HTTP status code")
    # vllm/entrypoints/common/cli_args.py:553-554 and :619-623: the server does not start
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        p.exit(1, "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser\n")
    if ns.enable_auto_tool_choice and ns.tool_call_parser not in TOOL_PARSERS:
        names = ",".join(sorted(TOOL_PARSERS))
        p.exit(1, f"KeyError: 'invalid tool call parser: {ns.tool_call_parser} "
                  f"(chose from {{ {names} }})'\n")  # fmt: skip
    kwargs = vars(ns)
    if ns.vram_asleep_mib is not None and ns.vram_asleep_mib > ns.vram_mib:
        p.error("--vram-asleep-mib must not exceed --vram-mib")
    if ns.num_labels < 1:
        p.error("--num-labels must be at least 1")
    kwargs["models"] = kwargs["models"] or ["fake-model"]
    kwargs["gpus"] = placed_gpus(p, ns.gpus, ns.tensor_parallel_size, os.environ.get(VISIBLE))
    del kwargs["tensor_parallel_size"]
    return FakeConfig(**kwargs)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))


if __name__ == "__main__":
    main()

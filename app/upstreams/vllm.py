"""What the control plane asks a local vLLM over HTTP (httpx): health, sleep mode, load.

- `health()`: `GET <health_path>` (vLLM's `/health`), 200 or not; never raises.
- `sleep(level)`, `wake_up(level=)`, `is_sleeping()`: vLLM's sleep mode. `POST
  /sleep?level=N` frees the weights (level 1 keeps them in host RAM, level 2 drops them)
  and the KV cache; `POST /wake_up` brings back what level 1 kept, a level-2 wake reloads
  the weights from disk (`wake_up`); `GET /is_sleeping` confirms. The server registers
  these routes only with `VLLM_SERVER_DEV_MODE=1` (and needs `--enable-sleep-mode`);
  otherwise they answer 404, reported as `SleepUnsupported` so the caller can stop the
  server instead. Parameters are query parameters, not a JSON body (but
  `/collective_rpc` takes one).
- `load()`: `GET /metrics`, parsed by `app.upstreams.vllm_load`; raises only `ScrapeError`.
- `load_lora_adapter(name, path)`, `unload_lora_adapter(name)`: vLLM's runtime LoRA
  routes (only with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`; `LoraError` otherwise).
- `asleep_level()`: the level a sleeping server sleeps at, from the `vllm:engine_sleep_state`
  gauge of its `/metrics` (for a server found asleep at gateway start).
- `learn()`: what it serves (`GET /openapi.json`), its `max_model_len` and the model
  ids it lists (`GET /v1/models`), each within `LEARN_TIMEOUT_S`
  (`app.upstreams.vllm_learned`).

Each sleep-mode call waits at most `timeout_s`, per backend (`timeouts.control_s`), by
default scaled by the size of its weights (`control_timeout_s`): a level-2 wake reloads
the weights from disk, and a level-1 sleep or wake copies them between GPU and host RAM,
both in proportion to their size. A call that runs out stops the server (the caller's
choice), so a fixed bound too short for a large model stops servers that are only slow.

Control calls and the scrape send the upstream's own key (vLLM `--api-key`); the health
check does not, as before: `/health` is open on vLLM. The requests of clients go through
`app.upstreams.http.HttpUpstream` (aiohttp), not through here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Final, cast

from app.upstreams.control_http import (
    AsyncClient,
    ConnectError,
    HTTPError,
    InvalidURL,
    Response,
    StreamError,
    TimeoutException,
)
from app.upstreams.vllm_learned import (
    Answer,
    Learned,
    LearnError,
    max_model_len_of,
    models_of,
    routes_of_openapi,
)
from app.upstreams.vllm_load import BackendLoad, MetricsParseError, ScrapeError, parse_vllm_load

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S: Final = 2.0
# Each of the two reads of `learn()`: a ready vLLM answers both at once.
LEARN_TIMEOUT_S: Final = 5.0
# The control timeout when nothing says how large the weights are, and its fixed part:
# starting the call, mapping memory back, a small model's weights.
CALL_TIMEOUT_S: Final = 60.0
# Per GiB of weights: the slowest copy expected of a healthy server. A level-2 wake reads
# the checkpoint from disk again (vLLM `reload_weights`); 10 s/GiB is ~107 MB/s, below a
# 1 Gbit/s network share (~118 MB/s) or a cold HDD, so only a stuck server runs out.
# A 70B bf16 model (~130 GiB): 60 + 1300 s, ~23 min; an 8B one (~15 GiB): ~3.5 min.
# A level-1 sleep or wake copies over PCIe (GB/s) and ends far within it.
CALL_TIMEOUT_S_PER_GIB: Final = 10.0
# `/collective_rpc` is told the timeout and answers with its own error when it runs out;
# the HTTP wait gets this much more so that answer, not our cut, ends the call.
RPC_ANSWER_MARGIN_S: Final = 5.0
SLEEP_STATE_SCRAPE_S: Final = 5.0
CONFIRM_POLL_S: Final = 0.1
_GIB: Final = 1024**3


def control_timeout_s(configured: float | None, weights_bytes: int | None) -> float:
    """The wait for one sleep-mode call: `configured` (`timeouts.control_s`) when set, else
    `CALL_TIMEOUT_S` plus `CALL_TIMEOUT_S_PER_GIB` for each GiB of weights (none known:
    `CALL_TIMEOUT_S`)."""
    if configured is not None:
        return configured
    if weights_bytes is None:
        return CALL_TIMEOUT_S
    return CALL_TIMEOUT_S + CALL_TIMEOUT_S_PER_GIB * weights_bytes / _GIB


class ControlError(Exception):
    """The server did not do what was asked; the message says what it answered."""


class ControlTimeout(ControlError):
    """The server did not answer (or did not report the state asked for) within the
    control timeout."""


class SleepUnsupported(ControlError):
    """The server does not offer sleep mode (no `VLLM_SERVER_DEV_MODE=1`)."""


class LoraError(ControlError):
    """A LoRA adapter could not be loaded or unloaded; the message says why."""


class VllmClient:
    """One backend's vLLM, spoken to over the gateway's shared control-plane client."""

    def __init__(
        self,
        client: AsyncClient,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        health_path: str = "/health",
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._headers = dict(headers or {})
        self._health_url = self._base + health_path
        self._timeout_s = timeout_s

    @property
    def timeout_s(self) -> float:
        """The wait for each sleep-mode call (see `control_timeout_s`)."""
        return self._timeout_s

    # -- health -----------------------------------------------------------------------

    @property
    def health_url(self) -> str:
        return self._health_url

    @property
    def base_url(self) -> str:
        return self._base

    async def health(self) -> str | None:
        """None when the server answers its health check with 200, else why not."""
        try:
            response = await self._client.get(self._health_url, timeout=HEALTH_TIMEOUT_S)
        except HTTPError as exc:
            return f"{type(exc).__name__}: {exc}".rstrip(": ")
        if response.status_code == 200:
            return None
        return f"health answered {response.status_code}"

    # -- sleep mode -------------------------------------------------------------------

    async def sleep(self, level: int) -> None:
        """Put the engine to sleep and wait until `/is_sleeping` says so."""
        await self._request("POST", "/sleep", {"level": str(level)})
        await self._confirm(True)

    async def wake_up(self, *, level: int | None) -> None:
        """Wake a server put to sleep at `level` (None: not known, e.g. found asleep at
        gateway start with no `vllm:engine_sleep_state`) and wait until `/is_sleeping`
        says awake.

        Level 1 offloaded the weights to host RAM: a plain `POST /wake_up` brings them
        back. Level 2 discarded them, and a plain wake leaves a server that answers
        garbage, so the weights are reloaded from disk between the two tags. The same
        sequence is safe after a level-1 sleep (it reloads what was offloaded), hence
        for an unknown level too. Each step raises `ControlError` when it fails."""
        if level in (0, 1):
            # Level 0 (found asleep: a paused scheduler, vllm/v1/engine/core.py `sleep`)
            # kept the weights on the GPU; level 1 kept them in host RAM: a wake without
            # tags wakes every sleeping tag and resumes scheduling (core.py `wake_up`).
            await self._request("POST", "/wake_up", None)
        else:
            # vLLM docs/features/sleep_mode.md, level 2 (reference/model_swap.md §5.1):
            # memory for the weights, the weights from disk, then the KV cache...
            await self._request("POST", "/wake_up", {"tags": "weights"})
            # vllm/entrypoints/serve/dev/rpc/api_router.py (0.33): the body is `method`,
            # optional `args` (strings), `kwargs` and `timeout` (seconds, passed to
            # `engine_client.collective_rpc(timeout=...)`). The multiprocess executor (TP > 1)
            # gives up at that deadline with `TimeoutError("RPC call to reload_weights timed
            # out.")`, answered as an error (vllm/v1/executor/multiproc_executor.py
            # `collective_rpc`); the single-GPU executor ignores it
            # (vllm/v1/executor/uniproc_executor.py), so our own wait bounds it there.
            reload: dict[str, str | float] = {
                "method": "reload_weights",
                "timeout": self._timeout_s,
            }
            await self._request(
                "POST",
                "/collective_rpc",
                None,
                json=reload,
                timeout_s=self._timeout_s + RPC_ANSWER_MARGIN_S,
            )
            await self._request("POST", "/wake_up", {"tags": "kv_cache"})
            # ...and (vLLM's sleep-mode blog, same §5.1) no prefix-cache entry computed
            # with the old weights may be reused.
            await self._request("POST", "/reset_prefix_cache", None)
        await self._confirm(False)

    async def asleep_level(self) -> int | None:
        """The level a sleeping server sleeps at, from `vllm:engine_sleep_state` in its
        `/metrics` (`app.upstreams.vllm_load.SLEEP_STATE`); None when it does not say (the
        gauge absent or saying awake, or the scrape failing). Never raises."""
        try:
            load = await self.load(timeout_s=SLEEP_STATE_SCRAPE_S)
        except ScrapeError:
            return None
        return load.sleep_level

    async def is_sleeping(self) -> bool:
        response = await self._request("GET", "/is_sleeping", None)
        try:
            value = response.json()["is_sleeping"]
        except (ValueError, KeyError, TypeError):
            raise ControlError(
                f"GET /is_sleeping answered {response.text[:200]!r}, not {{'is_sleeping': bool}}"
            ) from None
        if not isinstance(value, bool):
            raise ControlError(f"GET /is_sleeping answered is_sleeping={value!r}, not a bool")
        return value

    async def _request(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        *,
        json: dict[str, str | float] | None = None,
        timeout_s: float | None = None,
    ) -> Response:
        try:
            response = await self._client.request(
                method,
                self._base + path,
                params=params,
                json=json,
                headers=self._headers,
                timeout=self._timeout_s if timeout_s is None else timeout_s,
            )
        except TimeoutException as exc:
            wait = self._timeout_s if timeout_s is None else timeout_s
            raise ControlTimeout(
                f"{method} {path}: no answer within {wait:g}s ({type(exc).__name__})"
            ) from None
        except HTTPError as exc:
            raise ControlError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            raise SleepUnsupported(
                f"{method} {path} answered 404: the server does not offer sleep mode "
                "(start vLLM with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode)"
            )
        if response.status_code >= 400:
            raise ControlError(
                f"{method} {path} answered {response.status_code}: {response.text[:200]}"
            )
        return response

    async def _confirm(self, sleeping: bool) -> None:
        deadline = time.monotonic() + self._timeout_s
        while await self.is_sleeping() != sleeping:
            if time.monotonic() >= deadline:
                want = "asleep" if sleeping else "awake"
                raise ControlTimeout(
                    f"the server did not report {want} within {self._timeout_s:g}s"
                )
            await asyncio.sleep(CONFIRM_POLL_S)

    # -- LoRA adapters ------------------------------------------------------------------

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """`POST /v1/load_lora_adapter` (vllm/entrypoints/serve/lora/api_router.py; body
        `LoadLoRAAdapterRequest`). `load_inplace`: a server that still lists the adapter
        (its weights discarded by a level-2 sleep, or a gateway that restarted) loads it
        again rather than answering 400 "has already been loaded"."""
        body: dict[str, str | float] = {"lora_name": name, "lora_path": path}
        await self._lora("/v1/load_lora_adapter", {**body, "load_inplace": True})

    async def unload_lora_adapter(self, name: str) -> None:
        """`POST /v1/unload_lora_adapter`; an adapter the server does not hold (404 "cannot
        be found") counts as unloaded."""
        await self._lora("/v1/unload_lora_adapter", {"lora_name": name}, gone_ok=True)

    async def _lora(self, path: str, body: dict[str, Any], *, gone_ok: bool = False) -> None:
        try:
            response = await self._client.post(
                self._base + path, json=body, headers=self._headers, timeout=self._timeout_s
            )
        except HTTPError as exc:
            raise LoraError(f"POST {path}: {type(exc).__name__}: {exc}") from None
        status = response.status_code
        if status == 200:
            return
        text = response.text[:300]
        if status == 404 and "detail" in text:  # the route is not there (FastAPI's 404)
            raise LoraError(
                f"POST {path} answered 404: the server does not offer runtime LoRA loading "
                "(start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
            )
        if status == 404 and gone_ok:
            return
        raise LoraError(f"POST {path} answered {status}: {text}")

    # -- what it serves ---------------------------------------------------------------

    async def learn(self, model_ids: list[str]) -> Answer | None:
        """Its routes and `max_model_len`, as a ready server says them, and the model ids
        it lists; None when it did not answer (then what was known stays). `/openapi.json`
        answering 404 means vLLM's docs are off (`--disable-fastapi-docs`): `routes` None.
        Never raises."""
        # Both at once: a start's (or wake's) ready waits for them.
        answers = await asyncio.gather(
            *(
                self._client.get(self._base + path, headers=self._headers, timeout=LEARN_TIMEOUT_S)
                for path in ("/openapi.json", "/v1/models")
            ),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, HTTPError | InvalidURL | StreamError):
                logger.warning("cannot learn what it serves url=%s error=%s: %s", self._base,
                               type(answer).__name__, answer)  # fmt: skip
                return None
            if isinstance(answer, BaseException):
                raise answer
        openapi, models = cast("list[Response]", answers)
        routes: frozenset[tuple[str, str]] | None = None
        if openapi.status_code == 200:
            try:
                routes = routes_of_openapi(openapi.content)
            except LearnError as exc:
                logger.warning("its /openapi.json is not vLLM's url=%s error=%s", self._base, exc)
        elif openapi.status_code != 404:
            logger.warning("cannot learn its routes url=%s status=%d", self._base,
                           openapi.status_code)  # fmt: skip
            return None
        if models.status_code != 200:
            return Answer(Learned(routes, None), None)
        learned = Learned(routes, max_model_len_of(models.content, model_ids))
        return Answer(learned, models_of(models.content))

    # -- load -------------------------------------------------------------------------

    async def load(self, *, timeout_s: float) -> BackendLoad:
        """GET `/metrics` and parse it. Raises `ScrapeError`, never an httpx error."""
        url = f"{self._base}/metrics"
        try:
            response = await self._client.get(url, headers=self._headers, timeout=timeout_s)
        except ConnectError as exc:
            raise ScrapeError(f"cannot connect to {url}: {exc}", kind="connect") from None
        except TimeoutException:
            raise ScrapeError(
                f"GET {url} timed out after {timeout_s:g} s", kind="timeout"
            ) from None
        except (HTTPError, InvalidURL, StreamError) as exc:
            raise ScrapeError(f"GET {url} failed: {exc!r}", kind="request") from None
        if response.status_code != 200:
            raise ScrapeError(f"GET {url} answered HTTP {response.status_code}", kind="status")
        try:
            return parse_vllm_load(response.text)
        except MetricsParseError as exc:
            raise ScrapeError(f"GET {url}: {exc}", kind="parse") from None

"""A fake of Anthropic's Messages API (`POST /v1/messages`) for tests and the demo.

Run ``python -m app.sim.anthropic --port 8197 [--api-key-env VAR]``. Written from
Anthropic's documented behaviour:

- Requests need `x-api-key` (401 `authentication_error` when it is not the configured
  key; any key is accepted when none is configured) and `anthropic-version` (400). The
  body needs `model`, `max_tokens` >= 1 and non-empty `messages` whose roles are `user` or
  `assistant`; `temperature` must be in [0, 1]; every `tool_result` must answer a
  `tool_use` id of an earlier assistant turn; a prompt longer than `max_input_tokens`
  (about 4 characters a token) is refused with "prompt is too long". Errors have
  Anthropic's shape, `{"type": "error", "error": {"type", "message"}, "request_id"}`.
- The answer is a few words (`text`, or a fixed sentence), one `text_delta` each; with
  `reply: tool_use` (and tools in the request) it calls the first tool (the one a
  `tool_choice` names) with `tool_input`, its JSON sent in two `input_json_delta`s. It
  stops at `max_tokens` (`max_tokens`) or at a word listed in `stop_sequences`
  (`stop_sequence`), else `end_turn`; `stop_reason` overrides.
- A stream is `message_start`, per block `content_block_start`, (`ping` after the first),
  `content_block_delta`*, `content_block_stop`, then `message_delta` (stop reason and the
  cumulative `output_tokens`) and `message_stop`.

Failing on demand (``POST /_fake/faults``, null resets one; ``GET /_fake/faults``):
`fail_status` (+ `fail_count`, `error_type`, `retry_after`) answers with an error;
`stream_error_after` N sends an `error` event (`overloaded_error`) after N events of a
stream and ends it; `drop_after` N closes the connection after N events; `stall_after` N
sends nothing more after N events; `stall_before_headers` never answers; `ttft` waits
before the first content delta. ``GET``/``DELETE /_fake/stats``: the requests received
(the key itself is never recorded, only whether it matched) and counters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from app.sim.config import FaultOptions

Json = dict[str, Any]

DEFAULT_WORDS: Final = ("Hello", " from", " the", " fake", " Anthropic", " API", ".")
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
}


@dataclass
class AnthropicFaults(FaultOptions):
    """The fake's runtime faults (`FaultOptions`: `fail_status`, `fail_count`, `update`)."""

    error_type: str | None = None
    retry_after: str | None = None
    stream_error_after: int | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False
    ttft: float = 0.0
    reply: str = "text"  # text | tool_use
    tool_input: Json = field(default_factory=lambda: {"city": "Paris", "unit": "celsius"})
    stop_reason: str | None = None
    text: list[str] | None = None  # the answer's pieces, one delta (one token) each

    def _checked(self, key: str, value: object) -> Any:
        if key in ("error_type", "retry_after", "stop_reason"):
            if not isinstance(value, str):
                raise ValueError(f"{key} must be a string")
        elif key == "reply":
            if value not in ("text", "tool_use"):
                raise ValueError("reply must be 'text' or 'tool_use'")
        elif key == "tool_input":
            if not isinstance(value, dict):
                raise ValueError("tool_input must be an object")
        elif key == "text":
            if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                raise ValueError("text must be a list of strings")
        else:
            return super()._checked(key, value)
        return value


@dataclass
class FakeAnthropicConfig:
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None  # the key it accepts; None accepts any
    max_input_tokens: int = 200_000
    faults: AnthropicFaults = field(default_factory=AnthropicFaults)


class ApiError(Exception):
    def __init__(self, status: int, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or _ERROR_TYPES.get(status, "api_error")


class FakeAnthropic:
    def __init__(self, config: FakeAnthropicConfig) -> None:
        self.config = config
        self.faults = config.faults
        self.requests: deque[Json] = deque(maxlen=100)
        self.received = 0
        self.completed = 0
        self.failed = 0
        self.aborted = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- the API -----------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        self.received += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            return await self._messages(request)
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("x-api-key")
        key_ok = key is not None and (self.config.api_key in (None, key))
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests.append(
            {
                "path": request.path,
                "key_ok": key_ok,
                "headers": {
                    k.lower(): ("<redacted>" if k.lower() in ("x-api-key", "authorization") else v)
                    for k, v in request.headers.items()
                },
                "body": body,
            }
        )
        if self.faults.stall_before_headers:
            await asyncio.get_running_loop().create_future()
        try:
            if not key_ok:
                raise ApiError(401, "invalid x-api-key")
            if not request.headers.get("anthropic-version"):
                raise ApiError(400, "anthropic-version: header is required")
            status = self.faults.take_failure()
            if status is not None:
                self.failed += 1
                raise ApiError(status, _failure_message(status), self.faults.error_type)
            plan = self._plan(body)
        except ApiError as err:
            return self._error(err)
        if plan["stream"]:
            return await self._stream(request, plan)
        self.completed += 1
        return web.json_response(_message(plan))

    def _error(self, err: ApiError) -> web.Response:
        headers = {}
        if self.faults.retry_after is not None and err.status in (429, 503, 529):
            headers["retry-after"] = self.faults.retry_after
        body = {
            "type": "error",
            "error": {"type": err.error_type, "message": err.message},
            "request_id": f"req_{uuid.uuid4().hex[:24]}",
        }
        return web.json_response(body, status=err.status, headers=headers)

    def _plan(self, body: Any) -> Json:
        """Validate the request and decide the answer (blocks, stop reason, usage)."""
        if not isinstance(body, dict):
            raise ApiError(400, "The request body is not valid JSON.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ApiError(400, "model: Field required")
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, "max_tokens: Field required (an integer >= 1)")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: at least one message is required")
        temperature = body.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float) and 0 <= temperature <= 1
        ):
            raise ApiError(400, "temperature: Input should be less than or equal to 1")
        chars = len(json.dumps(body.get("system", ""))) + _check_messages(messages)
        input_tokens = chars // 4 + 1
        if input_tokens > self.config.max_input_tokens:
            raise ApiError(
                400,
                f"prompt is too long: {input_tokens} tokens > {self.config.max_input_tokens} "
                "maximum",
            )
        tools = body.get("tools") or []
        choice = body.get("tool_choice") or {}
        blocks: list[Json] = []
        words = list(self.faults.text or DEFAULT_WORDS)
        stop_reason, stop_sequence = "end_turn", None
        stops = body.get("stop_sequences") or []
        for i, word in enumerate(words):
            if word.strip() and word.strip() in stops:
                words, stop_reason, stop_sequence = words[:i], "stop_sequence", word.strip()
                break
        if len(words) > max_tokens:
            words, stop_reason = words[:max_tokens], "max_tokens"
        if self.faults.reply == "tool_use" and tools and choice.get("type") != "none":
            named = choice.get("name") if choice.get("type") == "tool" else None
            tool = next((t for t in tools if t.get("name") == named), tools[0])
            words = words[:2]
            arguments = json.dumps(self.faults.tool_input)
            half = len(arguments) // 2
            blocks.append({"type": "text", "pieces": words})
            blocks.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{uuid.uuid4().hex[:24]}",
                    "name": tool.get("name"),
                    "input": self.faults.tool_input,
                    "pieces": [arguments[:half], arguments[half:]],
                }
            )
            stop_reason = "tool_use"
        else:
            blocks.append({"type": "text", "pieces": words})
        if self.faults.stop_reason is not None:
            stop_reason = self.faults.stop_reason
        output_tokens = sum(len(b["pieces"]) for b in blocks)
        return {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "model": model,
            "stream": body.get("stream") is True,
            "blocks": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }

    async def _stream(self, request: web.Request, plan: Json) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        faults = self.faults
        sent = 0

        async def send(event: str, data: Json) -> bool:
            nonlocal sent
            if faults.stream_error_after is not None and sent >= faults.stream_error_after:
                error = {"type": "overloaded_error", "message": "Overloaded"}
                await response.write(_event("error", {"type": "error", "error": error}))
                return False
            await response.write(_event(event, data))
            sent += 1
            if faults.drop_after is not None and sent >= faults.drop_after:
                if request.transport is not None:
                    request.transport.close()
                return False
            if faults.stall_after is not None and sent >= faults.stall_after:
                await asyncio.get_running_loop().create_future()
            return True

        start = _message(plan, streaming=True)
        if not await send("message_start", {"type": "message_start", "message": start}):
            return response
        first = True
        for index, block in enumerate(plan["blocks"]):
            if block["type"] == "text":
                opening: Json = {"type": "text", "text": ""}
            else:
                opening = {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": {},
                }
            data = {"type": "content_block_start", "index": index, "content_block": opening}
            if not await send("content_block_start", data):
                return response
            if first:
                if not await send("ping", {"type": "ping"}):
                    return response
                if faults.ttft:
                    await asyncio.sleep(faults.ttft)
                first = False
            for piece in block["pieces"]:
                delta = (
                    {"type": "text_delta", "text": piece}
                    if block["type"] == "text"
                    else {"type": "input_json_delta", "partial_json": piece}
                )
                data = {"type": "content_block_delta", "index": index, "delta": delta}
                if not await send("content_block_delta", data):
                    return response
            if not await send("content_block_stop", {"type": "content_block_stop", "index": index}):
                return response
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": plan["stop_reason"], "stop_sequence": plan["stop_sequence"]},
            "usage": {"output_tokens": plan["output_tokens"]},
        }
        if not await send("message_delta", delta):
            return response
        if not await send("message_stop", {"type": "message_stop"}):
            return response
        self.completed += 1
        await response.write_eof()
        return response

    # --- test controls ---------------------------------------------------------------------

    async def get_faults(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.faults.as_dict())

    async def set_faults(self, request: web.Request) -> web.StreamResponse:
        try:
            self.faults.update_json(await request.read())
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.faults.as_dict())

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats())

    async def reset_stats(self, request: web.Request) -> web.StreamResponse:
        self.requests.clear()
        self.received = self.completed = self.failed = self.aborted = 0
        return web.json_response(self.stats())

    def stats(self) -> Json:
        return {
            "received": self.received,
            "completed": self.completed,
            "failed": self.failed,
            "aborted": self.aborted,
            "requests": list(self.requests),
        }

    async def on_shutdown(self, app: web.Application) -> None:
        for task in list(self._tasks):
            task.cancel()


def _check_messages(messages: list[Any]) -> int:
    """Validate roles and tool pairing; returns the characters of the prompt."""
    chars = 0
    tool_ids: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"messages.{i}.content: Input should be a string or a list")
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_use":
                tool_ids.add(str(block.get("id")))
            elif kind == "tool_result" and str(block.get("tool_use_id")) not in tool_ids:
                raise ApiError(
                    400,
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    "`tool_result` blocks: each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.",
                )
            chars += len(json.dumps(block))
    return chars


def _message(plan: Json, *, streaming: bool = False) -> Json:
    content: list[Json] = []
    if not streaming:
        for block in plan["blocks"]:
            if block["type"] == "text":
                content.append({"type": "text", "text": "".join(block["pieces"])})
            else:
                content.append(
                    {
                        "type": "tool_use",
                        "id": block["id"],
                        "name": block["name"],
                        "input": block["input"],
                    }
                )
    return {
        "id": plan["id"],
        "type": "message",
        "role": "assistant",
        "model": plan["model"],
        "content": content,
        "stop_reason": None if streaming else plan["stop_reason"],
        "stop_sequence": None if streaming else plan["stop_sequence"],
        "usage": {
            "input_tokens": plan["input_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 1 if streaming else plan["output_tokens"],
        },
    }


def _event(name: str, data: Json) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _failure_message(status: int) -> str:
    if status == 529:
        return "Overloaded"
    if status == 429:
        return "Number of request tokens has exceeded your per-minute rate limit"
    return f"Injected failure (fake Anthropic fail_status={status})"


FAKE_ANTHROPIC_KEY: Final = web.AppKey("fake_anthropic", FakeAnthropic)


def build_app(config: FakeAnthropicConfig) -> web.Application:
    fake = FakeAnthropic(config)
    app = web.Application(client_max_size=64 * 1024**2)
    app[FAKE_ANTHROPIC_KEY] = fake
    app.on_shutdown.append(fake.on_shutdown)
    app.router.add_post("/v1/messages", fake.messages)
    app.router.add_get("/_fake/faults", fake.get_faults)
    app.router.add_post("/_fake/faults", fake.set_faults)
    app.router.add_get("/_fake/stats", fake.get_stats)
    app.router.add_delete("/_fake/stats", fake.reset_stats)
    return app


class FakeAnthropicServer:
    """The fake inside the current event loop (for tests): ``async with``."""

    def __init__(self, config: FakeAnthropicConfig | None = None) -> None:
        self.config = config or FakeAnthropicConfig()
        self.app = build_app(self.config)
        self.fake = self.app[FAKE_ANTHROPIC_KEY]
        self._runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        self.url = ""

    async def start(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> FakeAnthropicServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def serve(config: FakeAnthropicConfig) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = FakeAnthropicServer(config)
    try:
        await server.start()
    except OSError as exc:
        print(f"fake-anthropic: cannot listen: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(f"INFO:     [fake-anthropic] listening on {server.url}", file=sys.stderr, flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await stop.wait()
    await server.stop()


def parse_args(argv: list[str] | None = None) -> FakeAnthropicConfig:
    p = argparse.ArgumentParser(prog="python -m app.sim.anthropic", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8197)
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="accept only the key in this environment variable (default: any key)",
    )
    p.add_argument("--max-input-tokens", type=int, default=200_000)
    p.add_argument("--ttft", type=float, default=0.0)
    ns = p.parse_args(argv)
    key = os.environ.get(ns.api_key_env) if ns.api_key_env else None
    if ns.api_key_env and not key:
        p.error(f"--api-key-env {ns.api_key_env}: the variable is unset or empty")
    return FakeAnthropicConfig(
        host=ns.host,
        port=ns.port,
        api_key=key,
        max_input_tokens=ns.max_input_tokens,
        faults=AnthropicFaults(ttft=ns.ttft),
    )


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()

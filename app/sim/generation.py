"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` of the fake vLLM server.

Streaming follows vLLM's serving classes: headers go out at once, the first chunk (for chat the
role delta, then the first token) after the TTFT, one token per SSE event, the last token chunk
carries ``finish_reason``, then the optional usage chunk (``choices: []``) and ``[DONE]``.
``drop_after``/``stall_after`` count every SSE event written (the chat role chunk included).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.sim.state import (
    FakeState,
    RequestRun,
    error_response,
    forever,
    json_response,
)
from app.sim.text import (
    DONE_EVENT,
    ApiError,
    StreamFormat,
    chat_prompt,
    chat_response,
    completion_prompt,
    completion_response,
    dumps,
    embedding_inputs,
    embedding_vector,
    encode_embedding,
    token_texts,
    validation_error,
)
from app.sim.tools import tool_call_chunks, tool_to_call, with_tool_call

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}


@dataclass(slots=True)
class _Gen:
    """A validated generation request."""

    chat: bool
    model: str
    prompt_tokens: int
    texts: list[str]
    finish: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    rid: str
    tool: str | None = None  # a tool to call instead of answering in text (app.sim.tools)


def _int_field(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error([key], "int_type", "Input should be a valid integer")
    return value


def ended(eos_after: int | None, count: int, finish: str) -> tuple[int, str]:
    """The answer's length and finish reason once the model's end of sequence is counted
    (`--eos-after`): a model that ends before its limit finishes with `stop`."""
    if eos_after is not None and eos_after < count:
        return eos_after, "stop"
    return count, finish


def _max_tokens(body: dict[str, Any], chat: bool) -> tuple[int | None, str]:
    """The output limit and the name it came under (chat: ``max_completion_tokens`` wins,
    vllm/entrypoints/openai/chat_completion/protocol.py ``build_tok_params``)."""
    if chat:
        value = _int_field(body, "max_completion_tokens")
        if value is not None:
            return value, "max_completion_tokens"
    return _int_field(body, "max_tokens"), "max_tokens"


def _too_long(max_len: int, prompt_tokens: int, what: str) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {max_len} tokens. However, {what} "
        f"{prompt_tokens} input tokens. Please reduce the length of the input messages. "
        f"(parameter=input_tokens, value={prompt_tokens})",
        param="input_tokens",
    )


class GenerationApi:
    """The model-serving endpoints of one fake server."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    def _validate(self, request: web.Request, body: dict[str, Any], chat: bool) -> _Gen:
        state = self.state
        model = state.resolve_model(body)
        key = "messages" if chat else "prompt"
        if key not in body:
            raise validation_error([key], "missing", "Field required")
        if chat:
            prompt_tokens, seed = chat_prompt(body["messages"])
        else:
            prompt_tokens, seed = completion_prompt(body["prompt"])
        max_tokens, max_param = _max_tokens(body, chat)
        n = _int_field(body, "n")
        if n is not None and n != 1:
            raise ApiError(400, "n > 1 is not supported by the fake vLLM server.", param="n")
        max_len = state.config.max_model_len
        if max_tokens is not None and max_tokens > max_len:
            # vllm/renderers/params.py TokenizeParams.__post_init__ (a VLLMValidationError)
            raise ApiError(
                400,
                f"{max_param}={max_tokens} cannot be greater than max_model_len={max_len}. "
                f"Please request fewer output tokens. (parameter={max_param}, value={max_tokens})",
                param=max_param,
            )
        if prompt_tokens >= max_len:
            raise _too_long(max_len, prompt_tokens, "your request has")
        if max_tokens is None:
            count, finish = min(state.config.max_tokens, max_len - prompt_tokens), "stop"
        elif max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.")
        else:
            # vllm/entrypoints/serve/utils/api_utils.py get_max_tokens: prompt + max_tokens
            # beyond the context is clamped to what is left, not refused
            count, finish = min(max_tokens, max_len - prompt_tokens), "length"
        count, finish = ended(state.config.eos_after, count, finish)
        stream = body.get("stream") is True
        options = body.get("stream_options")
        include_usage = continuous = False
        if options is not None:
            if not stream:
                msg = "Stream options can only be defined when `stream=True`."
                raise validation_error([], "value_error", msg)
            if not isinstance(options, dict):
                raise validation_error(
                    ["stream_options"], "model_type", "Input should be an object"
                )
            include_usage = bool(options.get("include_usage", True))  # vLLM's default
            continuous = include_usage and bool(options.get("continuous_usage_stats", False))
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        rid = ("chatcmpl-" if chat else "cmpl-") + base
        texts = token_texts(seed, count)
        tool = tool_to_call(body) if chat else None
        return _Gen(
            chat, model, prompt_tokens, texts, finish, stream, include_usage, continuous, rid, tool
        )

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            gen = self._validate(request, body, chat)
            priority = state.priority_of(body)
        except ApiError as err:
            return error_response(err)

        async def work(run: RequestRun) -> web.StreamResponse:
            if gen.stream:
                return await self._stream(request, run, gen)
            return await self._complete(run, gen)

        return await state.admit(arrival, work, priority=priority)

    def _timing(self) -> tuple[float, float]:
        faults = self.state.faults
        tps = faults.tokens_per_second
        return faults.ttft, (1.0 / tps if tps > 0 else 0.0)

    async def _complete(self, run: RequestRun, gen: _Gen) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        ttft, interval = self._timing()
        start = loop.time()
        count = len(gen.texts)
        await self.state.engine.wait_until(run.job, start + ttft + (count - 1) * interval)
        finish = gen.finish
        if run.job.aborted:  # sleep(mode=abort): return what was generated so far
            elapsed = loop.time() - start
            done = 0
            if elapsed >= ttft:
                done = count if interval == 0 else min(count, 1 + int((elapsed - ttft) / interval))
            count, finish = done, "abort"
        if count:
            self.state.first_token(run, gen.prompt_tokens)
        run.tokens = count
        build = chat_response if gen.chat else completion_response
        text = "".join(gen.texts[:count])
        body = build(gen.rid, int(time.time()), gen.model, text, finish, gen.prompt_tokens, count)
        if gen.tool is not None and finish != "abort":
            body = with_tool_call(body, gen.tool, text)
        run.outcome = finish
        return json_response(body)

    async def _stream(self, request: web.Request, run: RequestRun, gen: _Gen) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        engine, job = self.state.engine, run.job
        ttft, interval = self._timing()
        fmt = StreamFormat(gen.rid, int(time.time()), gen.model, gen.chat, gen.continuous_usage)
        prompt = gen.prompt_tokens
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await resp.prepare(request)
            if not await self._after_send(request, run):
                return resp
            start = loop.time()
            await engine.wait_until(job, start + ttft)
            if not job.aborted:
                self.state.first_token(run, prompt)
            if gen.chat and not await self._send(request, resp, run, fmt.role(prompt)):
                return resp
            texts, last = gen.texts, len(gen.texts) - 1
            if gen.tool is not None:  # the call whole, once its text is generated
                await engine.wait_until(job, start + ttft + last * interval)
                run.tokens = len(texts)
                head = {"id": gen.rid, "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": gen.model}  # fmt: skip
                for chunk in tool_call_chunks(head, gen.tool, "".join(texts)):
                    if not await self._send(request, resp, run, chunk):
                        return resp
                texts = []
            for i, text in enumerate(texts):
                if i and (interval or engine.pause == "all"):
                    await engine.wait_until(job, start + ttft + i * interval)
                if job.aborted:
                    break
                run.tokens += 1
                chunk = fmt.token(text, gen.finish if i == last else None, prompt, i + 1)
                if not await self._send(request, resp, run, chunk):
                    return resp
            finish = gen.finish
            if job.aborted:
                finish = "abort"
                chunk = fmt.token("", finish, prompt, run.tokens)
                if not await self._send(request, resp, run, chunk):
                    return resp
            if gen.include_usage:
                chunk = fmt.final_usage(prompt, run.tokens)
                if not await self._send(request, resp, run, chunk):
                    return resp
            await resp.write(DONE_EVENT)
            run.outcome = finish
        except ConnectionResetError:
            pass  # the client went away mid-write: stays counted as an abort
        return resp

    async def _send(
        self, request: web.Request, resp: web.StreamResponse, run: RequestRun, data: bytes
    ) -> bool:
        await resp.write(data)
        run.sent += 1
        return await self._after_send(request, run)

    async def _after_send(self, request: web.Request, run: RequestRun) -> bool:
        """Apply drop_after/stall_after; False when the connection was dropped."""
        if run.drop_after is not None and run.sent >= run.drop_after:
            run.outcome = "dropped"
            if request.transport is not None:
                request.transport.close()
            return False
        if run.stall_after is not None and run.sent >= run.stall_after:
            await forever()
        return True

    # Public names for the other endpoint modules (responses, audio) that stream the same way.
    timing = _timing
    send = _send
    after_send = _after_send

    # --- embeddings --------------------------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            model = state.resolve_model(body)
            if "input" not in body:
                raise validation_error(["input"], "missing", "Field required")
            inputs = embedding_inputs(body["input"])
            fmt = body.get("encoding_format") or "float"
            if fmt not in ("float", "base64"):
                msg = "Input should be 'float' or 'base64'"
                raise validation_error(["encoding_format"], "literal_error", msg)
            max_len = state.config.max_model_len
            for _, tokens in inputs:
                if tokens > max_len:
                    raise _too_long(max_len, tokens, "you requested")
            priority = state.priority_of(body)
        except ApiError as err:
            return error_response(err)
        rid = "embd-" + (request.headers.get("X-Request-Id") or uuid.uuid4().hex)

        async def work(run: RequestRun) -> web.StreamResponse:
            loop = asyncio.get_running_loop()
            await state.engine.wait_until(run.job, loop.time() + state.faults.ttft)
            if run.job.aborted:
                return error_response(ApiError(500, "Request aborted.", "InternalServerError"))
            prompt = sum(tokens for _, tokens in inputs)
            state.first_token(run, prompt)
            dim = state.config.embedding_dim
            data = [
                {
                    "index": i,
                    "object": "embedding",
                    "embedding": encode_embedding(embedding_vector(key, dim), fmt),
                }
                for i, (key, _) in enumerate(inputs)
            ]
            usage = {
                "prompt_tokens": prompt,
                "total_tokens": prompt,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            }
            created = int(time.time())
            payload = {
                "id": rid,
                "object": "list",
                "created": created,
                "model": model,
                "data": data,
                "usage": usage,
            }
            run.outcome = "stop"
            return json_response(dumps(payload))

        return await state.admit(arrival, work, priority=priority)

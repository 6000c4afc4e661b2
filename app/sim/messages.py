"""vLLM's native Anthropic Messages API on the fake server: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, which vLLM 0.33 registers for every generate model
(``vllm/entrypoints/generate/api_router.py`` attaches ``vllm/entrypoints/anthropic/api_router.py``).

As ``vllm/entrypoints/anthropic/serving.py`` (``AnthropicServingMessages``) does, the
request becomes a chat request (``to_chat_completion_request``) and the chat answer a
Messages one; the text, token timing, faults and stats are the chat endpoint's
(``app.sim.generation``, ``app.sim.tools``):

- Accepted as ``vllm/entrypoints/anthropic/protocol.py`` accepts it: ``model``,
  ``messages`` and ``max_tokens`` (> 0) required; roles ``user``, ``assistant`` and
  ``system`` (Claude Code's reminders); ``tool_addition``/``tool_removal`` blocks only in a
  system message. A body that fails these checks gets vLLM's validation error
  (``app.sim.text.validation_error``: FastAPI validates the body before the Anthropic
  handler runs, so it is in OpenAI's shape); every error the handler itself raises is in
  Anthropic's envelope (``translate_error_response``): an unknown model 404
  ``not_found_error``, a tool change naming an undeclared tool or ``max_tokens`` above the
  context 400 ``invalid_request_error``.
- The conversion keeps a system message at its place (a template that takes one there:
  ``merge_inline_system`` off), leaving out text starting with
  ``x-anthropic-billing-header``; tools are those in effect after the tool changes
  (``_resolve_tools``). The prompt is counted on the converted messages.
- ``max_tokens`` above ``--max-model-len`` is refused, a prompt that fills the context
  too; otherwise the output is clamped to what is left (vLLM 0.33,
  ``serve/utils/api_utils.py`` ``get_max_tokens``). Like the fake's chat endpoint, the
  answer is that many tokens long (``stop_reason: max_tokens``), or ``--eos-after`` tokens
  when fewer (``stop_reason: end_turn``: the model ended it).
- The answer (``messages_full_converter``): ``{"id": <the chat id>, "type": "message",
  "role": "assistant", "content", "model", "stop_reason", "usage"}`` with ``None`` fields
  left out (``exclude_none``). A stream (``message_stream_converter``, ``exclude_unset``)
  is ``message_start`` (usage: the prompt, 0 output), per block ``content_block_start``,
  ``content_block_delta``\\* and ``content_block_stop``, then ``message_delta`` (the stop
  reason, ``stop_sequence: null``, usage ``{"input_tokens", "output_tokens"}``) and
  ``message_stop``; framed ``event: <type>\\ndata: <json>\\n\\n``, no ``ping``, no
  ``[DONE]``. A tool call is a ``tool_use`` block whose input comes in two
  ``input_json_delta`` pieces.
- ``tool_choice`` becomes chat's (``auto``, ``any`` -> ``required``, ``none``, ``tool`` ->
  the named function), ``auto`` when ``tools`` are given without one; the request (and
  ``count_tokens``, which renders it too) is refused as the chat endpoint refuses it
  without ``--enable-auto-tool-choice --tool-call-parser`` (``app.sim.tools``), in
  Anthropic's envelope: Claude Code, which always sends tools, needs both flags.
- ``count_tokens``: ``{"input_tokens": N, "context_management": {"original_input_tokens": N}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Final

from aiohttp import web

from app.sim.generation import GenerationApi, ended
from app.sim.state import FakeState, RequestRun, json_response
from app.sim.text import ApiError, chat_prompt, dumps, token_texts, validation_error
from app.sim.tools import tool_choice_error, tool_to_call

Json = dict[str, Any]

_SSE_HEADERS: Final = {"Content-Type": "text/event-stream; charset=utf-8"}
_ROLES: Final = ("user", "assistant", "system")
_BLOCK_TYPES: Final = frozenset(
    {"text", "image", "tool_use", "tool_result", "tool_reference", "thinking",
     "redacted_thinking", "tool_addition", "tool_removal"}
)  # fmt: skip
_TOOL_CHANGES: Final = ("tool_addition", "tool_removal")
_BILLING: Final = "x-anthropic-billing-header"
_ERROR_TYPES: Final = {400: "invalid_request_error", 404: "not_found_error"}
_STOP: Final = {"stop": "end_turn", "length": "max_tokens"}
_TOOL_CHOICES: Final = {"auto": "auto", "any": "required", "none": "none", "tool": None}


class _HandlerError(Exception):
    """An error vLLM's Anthropic handler answers in Anthropic's envelope."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> web.Response:
        error = {"type": _ERROR_TYPES.get(self.status, "api_error"), "message": self.message}
        body = dumps({"type": "error", "error": error})
        return web.Response(status=self.status, body=body, content_type="application/json")


class MessagesApi:
    def __init__(self, state: FakeState, gen: GenerationApi) -> None:
        self.state = state
        self.gen = gen

    async def create(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            chat = _to_chat(body, count_only=False)
            model = _model(state, body)
            self._check_tools(chat)
            prompt, seed = chat_prompt(chat["messages"])
            count, finish = self._output(body["max_tokens"], prompt)
        except ApiError as err:
            return web.Response(status=err.status, body=err.body(), content_type="application/json")
        except _HandlerError as err:
            return err.response()
        rid = "chatcmpl-" + (request.headers.get("X-Request-Id") or uuid.uuid4().hex)
        answer = _Answer(rid, model, prompt, token_texts(seed, count), finish, tool_to_call(chat))

        async def work(run: RequestRun) -> web.StreamResponse:
            if body.get("stream") is True:
                return await self._stream(request, run, answer)
            return await self._complete(run, answer)

        return await state.admit(arrival, work)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.state.parse_body(request)
            chat = _to_chat(body, count_only=True)
            _model(self.state, body)
            self._check_tools(chat)
        except ApiError as err:
            return web.Response(status=err.status, body=err.body(), content_type="application/json")
        except _HandlerError as err:
            return err.response()
        prompt, _ = chat_prompt(chat["messages"])
        answer = {"input_tokens": prompt, "context_management": {"original_input_tokens": prompt}}
        return json_response(dumps(answer))

    def _check_tools(self, chat: Json) -> None:
        """vLLM renders the chat request, count_tokens' too, refusing a tool choice its
        server cannot parse (`app.sim.tools.tool_choice_error`), in Anthropic's envelope."""
        refused = tool_choice_error(
            chat.get("tool_choice"), tool_calling=self.state.config.tool_calling
        )
        if refused is not None:
            raise _HandlerError(refused.status, refused.message)

    def _output(self, max_tokens: int, prompt: int) -> tuple[int, str]:
        max_len = self.state.config.max_model_len
        if max_tokens > max_len:
            raise _HandlerError(
                400,
                f"max_completion_tokens={max_tokens} cannot be greater than "
                f"max_model_len={max_len}. Please request fewer output tokens.",
            )
        if prompt >= max_len:
            raise _HandlerError(
                400,
                f"Input length ({prompt}) exceeds model's maximum context length ({max_len}).",
            )
        count = min(max_tokens, max_len - prompt)  # as the chat endpoint writes
        return ended(self.state.config.eos_after, count, "length")

    async def _complete(self, run: RequestRun, answer: _Answer) -> web.StreamResponse:
        count = len(answer.texts)
        await self.gen.pacing(run).last(count)
        self.state.first_token(run, answer.prompt)
        run.tokens, run.outcome = count, answer.finish
        text = "".join(answer.texts)
        content: list[Json] = []
        if answer.tool is None:
            content.append({"type": "text", "text": text})
        else:
            content.append(answer.tool_use(text))
        body = {
            "id": answer.rid,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": answer.model,
            "stop_reason": answer.stop_reason,
            "usage": {"input_tokens": answer.prompt, "output_tokens": count},
        }
        return json_response(dumps(body))

    async def _stream(
        self, request: web.Request, run: RequestRun, answer: _Answer
    ) -> web.StreamResponse:
        gen = self.gen
        resp = web.StreamResponse(headers=_SSE_HEADERS)

        async def emit(data: Json) -> bool:
            event = b"event: " + data["type"].encode() + b"\ndata: " + dumps(data) + b"\n\n"
            return await gen.send(request, resp, run, event)

        start_message: Json = {
            "id": answer.rid, "type": "message", "role": "assistant", "content": [],
            "model": answer.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": answer.prompt, "output_tokens": 0},
        }  # fmt: skip
        try:
            pacing = await gen.started(request, run, resp)
            if pacing is None:
                return resp
            self.state.first_token(run, answer.prompt)
            if not await emit({"type": "message_start", "message": start_message}):
                return resp
            texts = answer.texts
            if answer.tool is not None:
                await pacing.last(len(texts))
                run.tokens = len(texts)
                block = answer.tool_use("".join(texts))
                arguments = json.dumps(block["input"])
                half = len(arguments) // 2
                events: list[Json] = [
                    {"type": "content_block_start", "content_block": {**block, "input": {}},
                     "index": 0},
                    *({"type": "content_block_delta",
                       "delta": {"type": "input_json_delta", "partial_json": piece}, "index": 0}
                      for piece in (arguments[:half], arguments[half:])),
                ]  # fmt: skip
                texts = []
            else:
                events = [
                    {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                     "index": 0}
                ]  # fmt: skip
            for event in events:
                if not await emit(event):
                    return resp
            for i, text in enumerate(texts):
                await pacing.token(i)
                run.tokens += 1
                delta = {"type": "text_delta", "text": text}
                if not await emit({"type": "content_block_delta", "delta": delta, "index": 0}):
                    return resp
            closing: list[Json] = [
                {"type": "content_block_stop", "index": 0},
                {"type": "message_delta",
                 "delta": {"stop_reason": answer.stop_reason, "stop_sequence": None},
                 "usage": {"input_tokens": answer.prompt, "output_tokens": run.tokens}},
                {"type": "message_stop"},
            ]  # fmt: skip
            for event in closing:
                if not await emit(event):
                    return resp
            run.outcome = answer.finish
        except ConnectionResetError:
            pass  # the client went away mid-write: stays counted as an abort
        return resp


class _Answer:
    __slots__ = ("finish", "model", "prompt", "rid", "texts", "tool")

    def __init__(
        self, rid: str, model: str, prompt: int, texts: list[str], finish: str, tool: str | None
    ) -> None:
        self.rid, self.model, self.prompt, self.texts = rid, model, prompt, texts
        self.finish = "stop" if tool is not None else finish  # vLLM's metric label
        self.tool = tool

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.tool is not None else _STOP[self.finish]

    def tool_use(self, text: str) -> Json:
        tool_id = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
        return {"type": "tool_use", "id": tool_id, "name": self.tool, "input": {"text": text}}


def _model(state: FakeState, body: Json) -> str:
    model = body["model"]
    if model not in state.models:
        raise _HandlerError(404, f"The model `{model}` does not exist.")
    return str(model)


# --- the request, as vLLM's protocol and converter take it ----------------------------------


def _to_chat(body: Json, *, count_only: bool) -> Json:
    """The chat request vLLM builds (messages and tools only: what the fake needs)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        missing = model is None
        kind, msg = (
            ("missing", "Field required") if missing else ("value_error", "Model is required")
        )
        raise validation_error(["model"], kind, msg)
    if not count_only:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise validation_error(["max_tokens"], "int_type", "Input should be a valid integer")
        if max_tokens <= 0:
            raise validation_error(["max_tokens"], "value_error", "max_tokens must be positive")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise validation_error(["messages"], "list_type", "Input should be a valid list")
    chat: list[Json] = []
    system = body.get("system")
    if system:
        texts = [system] if isinstance(system, str) else _texts(system, ["system"], system=False)
        if "".join(texts):
            chat.append({"role": "system", "content": "".join(texts)})
    changes: list[Json] = []
    for i, message in enumerate(messages):
        loc: list[str | int] = ["messages", i]
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            raise validation_error([*loc, "role"], "literal_error",
                                   "Input should be 'user', 'assistant' or 'system'")  # fmt: skip
        assert isinstance(message, dict)
        content = message.get("content")
        if isinstance(content, list):
            _check_blocks(content, [*loc, "content"], system=role == "system")
            changes.extend(b for b in content if b["type"] in _TOOL_CHANGES)
        elif not isinstance(content, str):
            raise validation_error(
                [*loc, "content"], "string_type", "Input should be a valid string"
            )
        if role == "system":
            text = "".join(_texts(content, loc, system=True))
            if text:
                chat.append({"role": "system", "content": text})
        else:
            chat.append({"role": role, "content": _plain(content)})
    declared = body.get("tools")
    tools = _resolve_tools(declared, changes)
    choice = _tool_choice(body.get("tool_choice"))
    if choice is None and (declared is not None or changes):
        choice = "auto"  # vLLM `_convert_tools`: tools given, even none left, and no choice
    return {
        "messages": chat,
        **({"tools": tools} if tools else {}),
        **({"tool_choice": choice} if choice is not None else {}),
    }


def _tool_choice(choice: Any) -> str | Json | None:
    """Anthropic's `tool_choice` as vLLM makes it chat's (`_convert_tool_choice`)."""
    if choice is None:
        return None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in _TOOL_CHOICES:
        raise validation_error(["tool_choice", "type"], "literal_error",
                               "Input should be 'auto', 'any', 'tool' or 'none'")  # fmt: skip
    assert isinstance(choice, dict)
    if kind != "tool":
        return _TOOL_CHOICES[kind]
    name = choice.get("name")
    if not name:
        msg = "Value error, tool_choice.name is required when type is 'tool'"
        raise validation_error(["tool_choice"], "value_error", msg)
    return {"type": "function", "function": {"name": name}}


def _check_blocks(blocks: list[Any], loc: list[str | int], *, system: bool) -> None:
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in _BLOCK_TYPES:
            raise validation_error(
                [*loc, j, "type"], "literal_error", "Input should be a block type"
            )
        if kind in _TOOL_CHANGES:
            tool = block.get("tool")
            problem = None
            if not system:
                problem = f'{kind} blocks are only allowed in messages with role "system"'
            elif not isinstance(tool, dict):
                problem = f"tool is required for {kind} blocks"
            elif kind == "tool_removal" and tool.get("type") != "tool_reference":
                problem = "tool_removal only accepts a tool_reference"
            if problem is not None:
                raise validation_error([*loc, j], "value_error", f"Value error, {problem}")


def _texts(content: Any, loc: list[str | int], *, system: bool) -> list[str]:
    """The text of a system prompt or message, billing headers left out (vLLM's
    ``_convert_system_message`` / ``_extract_system_text``)."""
    if isinstance(content, str):
        return [] if content.startswith(_BILLING) else [content]
    if not isinstance(content, list):
        raise validation_error(loc, "string_type", "Input should be a valid string")
    return [
        str(b["text"])
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        and b["text"] and not b["text"].startswith(_BILLING)
    ]  # fmt: skip


def _plain(content: Any) -> str:
    """The words of a user or assistant turn, for the prompt count and the seed."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if block.get("type") == "text":
            parts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_result":
            inner = block.get("content")
            parts.append(inner if isinstance(inner, str) else json.dumps(inner))
        elif block.get("type") == "tool_use":
            parts.append(json.dumps(block.get("input") or {}))
    return " ".join(parts)


def _resolve_tools(declared: Any, changes: list[Json]) -> list[Json]:
    """The tools in effect at the end (vLLM ``_resolve_tools``), as chat function tools."""
    tools: dict[str, Json] = {}
    for tool in declared if isinstance(declared, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            tools[tool["name"]] = tool
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change.get("type") == "tool_definition":
            definition = change.get("definition") or {}
            name = str(definition.get("name"))
            tools[name] = definition
        else:
            name = str(change.get("name"))
            if name not in tools:
                raise _HandlerError(
                    400, f"{block['type']} references tool {name!r}, which is not declared in tools"
                )
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [
        {"type": "function", "function": {"name": name, "parameters": tool.get("input_schema")}}
        for name, tool in tools.items()
        if name not in removed
    ]

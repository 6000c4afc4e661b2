"""vLLM's Responses API on the fake server: ``POST /v1/responses`` and the stored responses
(``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``: vLLM 0.33's route set,
``vllm/entrypoints/openai/responses/api_router.py``; no ``DELETE`` (405) and no
``input_items`` (404)). Only the fake's permissive mode (no ``--task``) also answers
``DELETE /v1/responses/{id}`` as OpenAI does (``{"id", "object": "response", "deleted":
true}``), for tests of a gateway's relay of it.

Shapes from vLLM's ``vllm/entrypoints/openai/responses/protocol.py`` (``ResponsesRequest``
defaults, ``ResponsesResponse`` with every field it always sends), the event sequence of
``responses/serving.py`` (``responses_stream_generator``: ``response.created``,
``response.in_progress``, then the text events, ``response.completed``; ``sequence_number``
from 0) and ``responses/simple_streaming_events.py`` (``output_item.added``,
``content_part.added``, one ``output_text.delta`` per token, ``output_text.done``,
``content_part.done``, ``output_item.done``); SSE framing ``event: <type>\\ndata: <json>``
as ``responses/api_router.py`` writes it (no ``[DONE]``). Errors as in ``serving.py``:
unknown id -> 404 ``Response with id '<id>' not found.``; cancelling a finished
(non-background) response -> 400 ``Cannot cancel a synchronous response.``.

Like vLLM, responses are kept only when the server runs with
``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``vllm/envs.py``; ``FakeConfig.responses_store``):
without it ``store`` is silently turned off (``serving.py`` ``create_responses``), so
``GET``/``cancel`` of any id and a ``previous_response_id`` answer that 404, and
``background`` with ``store`` is refused with vLLM's 400. With it, a
``previous_response_id`` the store does not hold is the same 404.

The text, token timing, faults and stats are the chat endpoint's (``app.sim.generation``):
the seed is the last user message, ``instructions`` is a system message. As in vLLM a
response that hit ``max_output_tokens`` is ``"incomplete"`` (``incomplete_details.reason``
``max_output_tokens``); without it the fake's ``--max-tokens`` applies and the status is
``"completed"``.

On purpose different from vLLM: ``background=true`` is refused (400); tools are accepted
and echoed but never called; the store is in memory and keeps the newest 1000 responses.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.sim.generation import GenerationApi
from app.sim.state import FakeState, RequestRun, error_response, json_response
from app.sim.text import ApiError, chat_prompt, dumps, token_texts, validation_error

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
_STORE_MAX = 1000
_TEXT_PART_TYPES = ("input_text", "output_text", "text")


def _not_found(response_id: str) -> ApiError:
    msg = f"Response with id '{response_id}' not found."
    return ApiError(404, msg, "invalid_request_error", "response_id")


def _item_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Chat messages from Responses input items (messages; other item types are skipped)."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise validation_error(["input", i], "model_type", "Input should be an object")
        if item.get("type", "message") != "message":
            continue  # function_call, function_call_output, reasoning...: no text to count
        if "role" not in item:
            raise validation_error(["input", i, "role"], "missing", "Field required")
        content = item.get("content")
        if isinstance(content, list):
            content = [
                {"type": "text", "text": part.get("text", "")}
                for part in content
                if isinstance(part, dict) and part.get("type") in _TEXT_PART_TYPES
            ]
        messages.append({"role": item["role"], "content": content})
    return messages


@dataclass(slots=True)
class _Req:
    """A validated Responses request."""

    rid: str
    model: str
    body: dict[str, Any]
    prompt_tokens: int
    texts: list[str]
    max_output_tokens: int
    limited: bool  # max_output_tokens given: the fake always reaches it ("incomplete")
    stream: bool
    store: bool
    created: int


class ResponsesApi:
    """The Responses endpoints of one fake server (shares its state and generation)."""

    def __init__(self, state: FakeState, gen: GenerationApi, *, store: bool = False) -> None:
        self.state = state
        self.gen = gen
        self.enable_store = store  # VLLM_ENABLE_RESPONSES_API_STORE
        self.store: OrderedDict[str, dict[str, Any]] = OrderedDict()

    # --- validation and bodies ---------------------------------------------------------------

    def _validate(self, request: web.Request, body: dict[str, Any]) -> _Req:
        state = self.state
        model = state.resolve_model(body)
        if "input" not in body:
            raise validation_error(["input"], "missing", "Field required")
        value = body["input"]
        if isinstance(value, str):
            messages: list[dict[str, Any]] = [{"role": "user", "content": value}]
        elif isinstance(value, list):
            messages = _item_messages(value)
        else:
            raise validation_error(["input"], "string_type", "Input should be a valid string")
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                msg = "Input should be a valid string"
                raise validation_error(["instructions"], "string_type", msg)
            messages.insert(0, {"role": "system", "content": instructions})
        for key in ("stream", "store", "background"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise validation_error([key], "bool_type", "Input should be a valid boolean")
        if body.get("store") is not False and body.get("background") and not self.enable_store:
            raise ApiError(  # vllm/entrypoints/openai/responses/serving.py, verbatim
                400,
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the environment "
                "variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                param="background",
            )
        if body.get("background"):
            raise ApiError(400, "background is not supported by the fake vLLM server.")
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                msg = "Input should be a valid string"
                raise validation_error(["previous_response_id"], "string_type", msg)
            if previous not in self.store:  # never anything without the store
                raise _not_found(previous)
        prompt_tokens, seed = chat_prompt(messages)
        max_len = state.config.max_model_len
        if prompt_tokens >= max_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                f"input messages. (parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        room = max_len - prompt_tokens
        limit = body.get("max_output_tokens")
        if limit is None:
            count, max_out, limited = min(state.config.max_tokens, room), room, False
        elif isinstance(limit, bool) or not isinstance(limit, int):
            msg = "Input should be a valid integer"
            raise validation_error(["max_output_tokens"], "int_type", msg)
        elif limit < 1:
            msg = f"max_output_tokens must be at least 1, got {limit}."
            raise ApiError(400, msg, param="max_output_tokens")
        elif limit > max_len:  # vllm/renderers/params.py TokenizeParams.__post_init__
            raise ApiError(
                400,
                f"max_output_tokens={limit} cannot be greater than max_model_len={max_len}. "
                f"Please request fewer output tokens. (parameter=max_output_tokens, "
                f"value={limit})",
                param="max_output_tokens",
            )
        else:
            count = max_out = min(limit, room)
            limited = True
        # vLLM names the response after the body's `request_id` (a vLLM extra field,
        # default `resp_<uuid>`: vllm/entrypoints/openai/responses/protocol.py), not after
        # the X-Request-Id header.
        given = body.get("request_id")
        return _Req(
            rid=given if isinstance(given, str) and given else f"resp_{uuid.uuid4().hex}",
            model=model,
            body=body,
            prompt_tokens=prompt_tokens,
            texts=token_texts(seed, count),
            max_output_tokens=max_out,
            limited=limited,
            stream=body.get("stream") is True,
            store=self.enable_store and body.get("store") is not False,
            created=int(time.time()),
        )

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, Any]:
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }

    @staticmethod
    def _message(item_id: str, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [_text_part(text)]
        return {
            "id": item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
        }

    def _response(
        self,
        req: _Req,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        body = req.body
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        return {
            "id": req.rid,
            "created_at": req.created,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": req.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
            "temperature": 1.0 if temperature is None else temperature,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": 1.0 if top_p is None else top_p,
            "background": False,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": body.get("previous_response_id"),
            "prompt": None,
            "reasoning": body.get("reasoning"),
            "service_tier": body.get("service_tier") or "auto",
            "status": status,
            "text": body.get("text"),
            "top_logprobs": None,
            "truncation": body.get("truncation") or "disabled",
            "usage": usage,
            "user": body.get("user"),
            "input_messages": None,
            "output_messages": None,
        }

    def _finish(
        self, req: _Req, run: RequestRun, count: int, item_id: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """(status, final response) after ``count`` tokens; stores it when asked to."""
        if run.job.aborted:
            status, finish = "cancelled", "abort"
        elif req.limited:
            status, finish = "incomplete", "length"
        else:
            status, finish = "completed", "stop"
        item_id = item_id or f"msg_{uuid.uuid4().hex}"
        item = self._message(item_id, "".join(req.texts[:count]), "completed")
        final = self._response(req, status, [item], self._usage(req.prompt_tokens, count))
        if req.store:
            self.store[req.rid] = final
            while len(self.store) > _STORE_MAX:
                self.store.popitem(last=False)
        run.outcome = finish
        return status, final

    # --- handlers ----------------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            req = self._validate(request, body)
            priority = state.priority_of(body)
        except ApiError as err:
            return error_response(err)

        async def work(run: RequestRun) -> web.StreamResponse:
            if req.stream:
                return await self._stream(request, run, req)
            return await self._complete(run, req)

        return await state.admit(arrival, work, priority=priority)

    async def _complete(self, run: RequestRun, req: _Req) -> web.StreamResponse:
        count = await self.gen.generated(run, len(req.texts), req.prompt_tokens)
        _, final = self._finish(req, run, count)
        return json_response(dumps(final))

    async def _stream(self, request: web.Request, run: RequestRun, req: _Req) -> web.StreamResponse:
        job, gen = run.job, self.gen
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        seq = 0

        async def emit(event: dict[str, Any]) -> bool:
            nonlocal seq
            event["sequence_number"] = seq
            seq += 1
            data = b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"
            return await gen.send(request, resp, run, data)

        item_id = f"msg_{uuid.uuid4().hex}"
        initial = self._response(req, "in_progress", [], None)
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        try:
            await resp.prepare(request)
            if not await gen.after_send(request, run):
                return resp
            for kind in ("response.created", "response.in_progress"):
                if not await emit({"type": kind, "response": initial}):
                    return resp
            pacing = gen.pacing(run)
            await pacing.first()
            if not job.aborted:
                self.state.first_token(run, req.prompt_tokens)
            opening = [
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": self._message(item_id, None, "in_progress"),
                },
                {
                    "type": "response.content_part.added",
                    **where,
                    "part": {**_text_part(""), "logprobs": []},
                },
            ]
            for event in opening:
                if not await emit(event):
                    return resp
            for i, text in enumerate(req.texts):
                await pacing.token(i)
                if job.aborted:
                    break
                run.tokens += 1
                delta = {"type": "response.output_text.delta", **where, "delta": text}
                if not await emit({**delta, "logprobs": []}):
                    return resp
            _, final = self._finish(req, run, run.tokens, item_id)
            outcome, run.outcome = run.outcome, "abort"  # until the last event is out
            text = "".join(req.texts[: run.tokens])
            closing = [
                {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **where, "part": _text_part(text)},
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": final["output"][0],
                },
                {"type": "response.completed", "response": final},
            ]
            for event in closing:
                if not await emit(event):
                    return resp
            run.outcome = outcome
        except ConnectionResetError:
            pass  # the client went away mid-write: stays counted as an abort
        return resp

    def _stored(self, request: web.Request) -> tuple[str, web.Response | None]:
        """The id, and the answer when the request ends here: an injected failure, or 404
        for an id the store does not hold."""
        self.state.record(request, None)
        response_id = request.match_info["response_id"]
        failure = self.state.injected_failure()
        if failure is None and response_id not in self.store:
            failure = error_response(_not_found(response_id))
        return response_id, failure

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        response_id, answered = self._stored(request)
        return answered or json_response(dumps(self.store[response_id]))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        _, answered = self._stored(request)
        # Every stored response of the fake is finished (no background mode): like vLLM.
        msg = "Cannot cancel a synchronous response."
        return answered or error_response(
            ApiError(400, msg, "invalid_request_error", "response_id")
        )

    async def delete(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's DELETE (permissive mode only; vLLM 0.33 has no such route)."""
        response_id, answered = self._stored(request)
        if answered is not None:
            return answered
        del self.store[response_id]
        return json_response(dumps({"id": response_id, "object": "response", "deleted": True}))


def _text_part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}

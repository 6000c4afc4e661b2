"""Deterministic "model output" and vLLM-shaped payloads for the fake vLLM server.

Nothing here does I/O. Shapes follow vLLM's OpenAI server
(``vllm/entrypoints/openai/*/protocol.py`` and the serving classes): compact JSON, errors as
``{"error": {"message", "type", "param", "code"}}``, streaming chunks as ``data: {json}\\n\\n``.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

DONE_EVENT = b"data: [DONE]\n\n"


def dumps(obj: object) -> bytes:
    """Compact JSON, like pydantic's ``model_dump_json``; text UTF-8 cannot hold (a lone
    surrogate a client sent as a JSON escape) is written as an escape again."""
    text = _dumps(obj)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


class ApiError(Exception):
    """A request that vLLM would answer with its error body and ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> bytes:
    return dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def error_type_for(status: int) -> str:
    """vLLM's ``type`` for a status: BadRequestError, NotFoundError, InternalServerError..."""
    known = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
    if status in known:
        return known[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    return phrase.replace(" ", "").replace("-", "") + "Error"


def validation_error(loc: Sequence[str | int], err: str, msg: str) -> ApiError:
    """Mimic vLLM's handler for FastAPI's RequestValidationError (400, type 'Bad Request')."""
    loc_t = ("body", *loc)
    message = f"1 validation error:\n  {{'type': '{err}', 'loc': {loc_t!r}, 'msg': '{msg}'}}"
    return ApiError(400, message, HTTPStatus.BAD_REQUEST.phrase, ".".join(map(str, loc_t)))


def query_error(
    name: str, err: str, msg: str, value: str, ctx: Mapping[str, object] | None = None
) -> ApiError:
    """vLLM 0.33's handler for a FastAPI query-parameter validation error
    (vllm/entrypoints/serve/exception_handling/handlers/validation.py: ``loc`` joined with
    dots, ``param`` the same)."""
    detail: dict[str, object] = {"type": err, "loc": f"query.{name}", "msg": msg, "input": value}
    if ctx is not None:
        detail["ctx"] = dict(ctx)
    message = f"1 validation error:\n  {detail!r}"
    return ApiError(400, message, HTTPStatus.BAD_REQUEST.phrase, f"query.{name}")


def model_not_found(model: str, served: list[str]) -> ApiError:
    """vllm/entrypoints/serve/engine/serving.py ``_check_model``."""
    return ApiError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}.",
        "NotFoundError",
        "model",
    )


# --- prompts and deterministic output -------------------------------------------------------


def content_text(content: Any) -> str:
    """Text of a chat message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def chat_prompt(messages: Any) -> tuple[int, list[str]]:
    """(prompt token count, seed words) for a chat request; seed = last user message."""
    if not isinstance(messages, list):
        raise validation_error(["messages"], "list_type", "Input should be a valid list")
    total = 0
    seed: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise validation_error(["messages", i], "missing", "Field required")
        words = content_text(message.get("content")).split()
        total += len(words)
        if message["role"] == "user":
            seed = words
    return max(total, 1), seed


def completion_prompt(prompt: Any) -> tuple[int, list[str]]:
    """(prompt token count, seed words) for a completion prompt (string or token ids)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        words = prompt.split()
        return max(len(words), 1), words
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), []
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "Batched prompts are not supported by the fake vLLM server.")
    raise validation_error(["prompt"], "string_type", "Input should be a valid string")


def token_texts(seed: Sequence[str], count: int) -> list[str]:
    """``count`` deterministic token strings; joined they read as space-separated words."""
    if not seed:
        return [f"tok{i}" if i == 0 else f" tok{i}" for i in range(count)]
    n = len(seed)
    return [seed[i % n] if i == 0 else " " + seed[i % n] for i in range(count)]


def embedding_inputs(value: Any) -> list[tuple[str, int]]:
    """(key, token count) per embedding input: a string, list of strings, or token lists."""
    if isinstance(value, str):
        return [(value, max(len(value.split()), 1))]
    if isinstance(value, list) and value:
        if all(isinstance(t, int) for t in value):
            return [(",".join(map(str, value)), len(value))]
        out: list[tuple[str, int]] = []
        for item in value:
            if isinstance(item, str):
                out.append((item, max(len(item.split()), 1)))
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                out.append((",".join(map(str, item)), max(len(item), 1)))
            else:
                break
        else:
            return out
    raise validation_error(["input"], "string_type", "Input should be a valid string")


def embedding_vector(key: str, dim: int) -> list[float]:
    """A deterministic, L2-normalised vector (vLLM normalises embeddings by default)."""
    state = zlib.crc32(key.encode()) or 1
    raw: list[float] = []
    for _ in range(dim):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        raw.append(state / 0x3FFFFFFF - 1.0)
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [v / norm for v in raw]


def encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


# --- response bodies ------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def list_response(rid: str, model: str, data: list[dict[str, Any]], prompt: int) -> dict[str, Any]:
    """vLLM's list answer (embeddings, pooling, classify, score), created now."""
    return {
        "id": rid,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": usage(prompt, 0),
    }


def chat_response(
    rid: str, created: int, model: str, text: str, finish: str, prompt: int, completion: int
) -> bytes:
    return dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt, completion),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


def completion_response(
    rid: str, created: int, model: str, text: str, finish: str, prompt: int, completion: int
) -> bytes:
    return dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt, completion),
            "kv_transfer_params": None,
        }
    )


class StreamFormat:
    """Pre-rendered SSE chunk templates for one streaming request (cheap per token)."""

    __slots__ = ("_head", "chat", "continuous")

    def __init__(
        self, rid: str, created: int, model: str, chat: bool, continuous_usage: bool
    ) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = dumps({"id": rid, "object": obj, "created": created, "model": model})
        self._head = b"data: " + head[:-1] + b',"choices":[{"index":0,'
        self.chat = chat
        self.continuous = continuous_usage

    def _usage_tail(self, prompt: int, completion: int) -> bytes:
        if not self.continuous:
            return b"}\n\n"
        tail = dumps({"prompt_tokens": prompt, "total_tokens": prompt + completion})
        return b',"usage":' + tail[:-1] + b',"completion_tokens":%d}}\n\n' % completion

    def role(self, prompt: int) -> bytes:
        body = b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
        return self._head + body + self._usage_tail(prompt, 0)

    def token(self, text: str, finish: str | None, prompt: int, completion: int) -> bytes:
        if self.chat:
            body = b'"delta":{"content":' + dumps(text) + b'},"logprobs":null,'
        else:
            body = b'"text":' + dumps(text) + b',"logprobs":null,'
        if finish is None:
            body += b'"finish_reason":null'
            if not self.chat:
                body += b',"stop_reason":null'
        else:
            body += b'"finish_reason":' + dumps(finish) + b',"stop_reason":null'
        return self._head + body + b"}]" + self._usage_tail(prompt, completion)

    def final_usage(self, prompt: int, completion: int) -> bytes:
        head = self._head[: -len(b'"choices":[{"index":0,')]
        body = dumps({"prompt_tokens": prompt, "total_tokens": prompt + completion})
        body = body[:-1] + b',"completion_tokens":%d}' % completion
        return head + b'"choices":[],"usage":' + body + b"}\n\n"

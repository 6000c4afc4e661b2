"""Tokenizer and pooling-runner endpoints of the fake vLLM server.

* ``POST /tokenize``, ``/detokenize``: ``vllm/entrypoints/serve/tokenize/protocol.py``
  (``TokenizeCompletionRequest`` / ``TokenizeChatRequest`` -> ``{"count", "max_model_len",
  "tokens", "token_strs"}``, ``token_strs`` only with ``return_token_strs``;
  ``DetokenizeRequest`` -> ``{"prompt"}``).
* ``POST /rerank``, ``/v1/rerank``, ``/v2/rerank`` and ``/score``, ``/v1/score``:
  ``vllm/entrypoints/pooling/scoring/protocol.py`` (``RerankRequest``: query, documents,
  top_n (0 = all) -> ``RerankResponse``; ``ScoreRequest`` with ``text_1``/``text_2``,
  ``queries``/``documents``, ``queries``/``items`` or ``data_1``/``data_2``, 1:1, 1:N or N:N
  -> ``ScoreResponse``).
* ``POST /pooling``: ``vllm/entrypoints/pooling/pooling/protocol.py`` (``PoolingResponse``,
  ``object: "pooling"`` per input).
* ``POST /classify``: ``vllm/entrypoints/pooling/classify/protocol.py``
  (``ClassificationData``: index, label, probs, num_classes).

A "token" is a whitespace-separated word, as everywhere in the fake, so ``/tokenize``'s count
equals the ``prompt_tokens`` the generation endpoints report for the same prompt or messages
(``add_generation_prompt`` adds no tokens here). Token ids come from a per-server vocabulary
filled as words are seen, so ``/detokenize`` returns the words of ids it handed out (unknown
ids read ``<unk:ID>``; an empty prompt is one ``<s>`` token, id 1). Scores are deterministic:
relevance = shared lower-cased words / words in either text (Jaccard), so tests can assert
order; pooling vectors are the embedding endpoint's; classification has two labels.
On purpose different from vLLM: one fake serves all of these at once (vLLM serves only the
tasks of its model), and documents/inputs are text (no multimodal parts).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from app.sim.state import FakeState, RequestRun, error_response, json_response
from app.sim.text import (
    ApiError,
    chat_prompt,
    completion_prompt,
    content_text,
    dumps,
    embedding_inputs,
    embedding_vector,
    encode_embedding,
    list_response,
    validation_error,
)

_WORD = re.compile(r"\w+")
_LABELS = ("negative", "positive")
_SCORE_PAIRS: tuple[tuple[str, str], ...] = (
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
)

Payload = Callable[[], dict[str, Any]]


def relevance(query: str, document: str) -> float:
    """Deterministic score in [0, 1]: Jaccard similarity of the lower-cased word sets."""
    q = set(_WORD.findall(query.lower()))
    d = set(_WORD.findall(document.lower()))
    union = q | d
    return round(len(q & d) / len(union), 6) if union else 0.0


def word_count(text: str) -> int:
    return max(len(text.split()), 1)


def _text_list(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return [value["text"]]
    raise validation_error([key], "string_type", "Input should be a valid string")


class PoolingApi:
    """``/tokenize``, ``/detokenize``, rerank, score, pooling and classify of one fake."""

    def __init__(self, state: FakeState) -> None:
        self.state = state
        self.vocab: dict[str, int] = {"<s>": 1}
        self.words: dict[int, str] = {1: "<s>"}

    # --- shared request handling -------------------------------------------------------------

    async def run(
        self,
        request: web.Request,
        prefix: str,
        prepare: Callable[[dict[str, Any], str, str], tuple[int, Payload]],
    ) -> web.StreamResponse:
        """Parse, validate (``prepare`` -> prompt tokens and the payload builder), apply the
        status fault, then answer after the TTFT fault as one tracked request."""
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            model = state.resolve_model(body)
            rid = prefix + (request.headers.get("X-Request-Id") or uuid.uuid4().hex)
            prompt, payload = prepare(body, model, rid)
            max_len = state.config.max_model_len
            if prompt > max_len:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {max_len} tokens. However, you "
                    f"requested {prompt} tokens in the input. Please reduce the length of "
                    f"the input. (parameter=max_model_len, value={prompt})",
                    param="max_model_len",
                )
        except ApiError as err:
            return error_response(err)

        async def work(run: RequestRun) -> web.StreamResponse:
            loop = asyncio.get_running_loop()
            await state.engine.wait_until(run.job, loop.time() + state.faults.ttft)
            if run.job.aborted:
                return error_response(ApiError(500, "Request aborted.", "InternalServerError"))
            state.first_token(run, prompt)
            run.outcome = "stop"
            return json_response(dumps(payload()))

        return await state.admit(arrival, work)

    # --- tokenizer ---------------------------------------------------------------------------

    def _ids(self, words: list[str]) -> list[int]:
        ids = []
        for word in words or ["<s>"]:
            tid = self.vocab.get(word)
            if tid is None:
                tid = self.vocab[word] = len(self.vocab) + 99
                self.words[tid] = word
            ids.append(tid)
        return ids

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        try:
            body = await state.parse_body(request)
            state.resolve_model(body)
            if "messages" in body:
                count, _ = chat_prompt(body["messages"])
                words = [
                    w for m in body["messages"] for w in content_text(m.get("content")).split()
                ]
                for key in ("add_generation_prompt", "continue_final_message"):
                    if body.get(key) is not None and not isinstance(body[key], bool):
                        msg = "Input should be a valid boolean"
                        raise validation_error([key], "bool_type", msg)
                if body.get("continue_final_message") and body.get("add_generation_prompt"):
                    raise ApiError(
                        400,
                        "Cannot set both `continue_final_message` and `add_generation_prompt` "
                        "to True.",
                    )
            elif "prompt" in body:
                if not isinstance(body["prompt"], str):
                    msg = "Input should be a valid string"
                    raise validation_error(["prompt"], "string_type", msg)
                count, words = completion_prompt(body["prompt"])
            else:
                raise validation_error(["prompt"], "missing", "Field required")
        except ApiError as err:
            return error_response(err)
        failure = state.injected_failure()
        if failure is not None:
            return failure
        tokens = self._ids(words)
        strs = [self.words[t] for t in tokens] if body.get("return_token_strs") else None
        return json_response(
            dumps(
                {
                    "count": count,
                    "max_model_len": state.config.max_model_len,
                    "tokens": tokens,
                    "token_strs": strs,
                }
            )
        )

    async def detokenize(self, request: web.Request) -> web.StreamResponse:
        state = self.state
        try:
            body = await state.parse_body(request)
            state.resolve_model(body)
            tokens = body.get("tokens")
            if tokens is None:
                raise validation_error(["tokens"], "missing", "Field required")
            if not isinstance(tokens, list):
                raise validation_error(["tokens"], "list_type", "Input should be a valid list")
            for i, t in enumerate(tokens):
                if isinstance(t, bool) or not isinstance(t, int):
                    msg = "Input should be a valid integer"
                    raise validation_error(["tokens", i], "int_type", msg)
                if t < 0:
                    msg = "Input should be greater than or equal to 0"
                    raise validation_error(["tokens", i], "greater_than_equal", msg)
        except ApiError as err:
            return error_response(err)
        failure = state.injected_failure()
        if failure is not None:
            return failure
        words = [self.words.get(t, f"<unk:{t}>") for t in tokens if t != 1]
        return json_response(dumps({"prompt": " ".join(words)}))

    # --- rerank and score --------------------------------------------------------------------

    async def rerank(self, request: web.Request) -> web.StreamResponse:
        def prepare(body: dict[str, Any], model: str, rid: str) -> tuple[int, Payload]:
            for key in ("query", "documents"):
                if key not in body:
                    raise validation_error([key], "missing", "Field required")
            query = _text_list(body["query"], "query")
            if len(query) != 1:
                raise validation_error(["query"], "string_type", "Input should be a valid string")
            docs = _text_list(body["documents"], "documents")
            top_n = body.get("top_n") or 0
            if isinstance(top_n, bool) or not isinstance(top_n, int):
                raise validation_error(["top_n"], "int_type", "Input should be a valid integer")
            prompt = sum(word_count(query[0]) + word_count(d) for d in docs)
            scored = [(relevance(query[0], d), i, d) for i, d in enumerate(docs)]
            scored.sort(key=lambda r: (-r[0], r[1]))
            if top_n > 0:
                scored = scored[:top_n]
            results = [
                {
                    "index": i,
                    "document": {"text": d, "multi_modal": None},
                    "relevance_score": score,
                }
                for score, i, d in scored
            ]
            usage_ = {"prompt_tokens": prompt, "total_tokens": prompt}
            return prompt, lambda: {"id": rid, "model": model, "usage": usage_, "results": results}

        return await self.run(request, "rerank-", prepare)

    async def score(self, request: web.Request) -> web.StreamResponse:
        def prepare(body: dict[str, Any], model: str, rid: str) -> tuple[int, Payload]:
            pair = next((p for p in _SCORE_PAIRS if p[0] in body and p[1] in body), None)
            if pair is None:
                raise validation_error(["text_1"], "missing", "Field required")
            left = _text_list(body[pair[0]], pair[0])
            right = _text_list(body[pair[1]], pair[1])
            if len(left) == 1:
                left = left * len(right)
            elif len(left) != len(right):
                raise ApiError(400, "Input lengths must be either 1:1, 1:N or N:N")
            prompt = sum(word_count(a) + word_count(b) for a, b in zip(left, right, strict=True))
            data = [
                {"index": i, "object": "score", "score": relevance(a, b)}
                for i, (a, b) in enumerate(zip(left, right, strict=True))
            ]
            return prompt, lambda: list_response(rid, model, data, prompt)

        return await self.run(request, "score-", prepare)

    # --- pooling and classify ----------------------------------------------------------------

    @staticmethod
    def _inputs(body: dict[str, Any]) -> list[tuple[str, int]]:
        if "messages" in body:
            count, _ = chat_prompt(body["messages"])
            text = " ".join(content_text(m.get("content")) for m in body["messages"])
            return [(text, count)]
        if "input" not in body:
            raise validation_error(["input"], "missing", "Field required")
        return embedding_inputs(body["input"])

    async def pooling(self, request: web.Request) -> web.StreamResponse:
        dim = self.state.config.embedding_dim

        def prepare(body: dict[str, Any], model: str, rid: str) -> tuple[int, Payload]:
            inputs = self._inputs(body)
            fmt = body.get("encoding_format") or "float"
            if fmt not in ("float", "base64"):
                msg = "Input should be 'float' or 'base64'"
                raise validation_error(["encoding_format"], "literal_error", msg)
            data = [
                {
                    "index": i,
                    "object": "pooling",
                    "data": encode_embedding(embedding_vector(key, dim), fmt),
                }
                for i, (key, _) in enumerate(inputs)
            ]
            prompt = sum(n for _, n in inputs)
            return prompt, lambda: list_response(rid, model, data, prompt)

        return await self.run(request, "pool-", prepare)

    async def classify(self, request: web.Request) -> web.StreamResponse:
        def prepare(body: dict[str, Any], model: str, rid: str) -> tuple[int, Payload]:
            inputs = self._inputs(body)
            data = []
            for i, (key, _) in enumerate(inputs):
                logits = embedding_vector(key, len(_LABELS))
                exps = [math.exp(v) for v in logits]
                probs = [e / sum(exps) for e in exps]
                best = max(range(len(probs)), key=probs.__getitem__)
                data.append(
                    {"index": i, "label": _LABELS[best], "probs": probs, "num_classes": len(probs)}
                )
            prompt = sum(n for _, n in inputs)
            return prompt, lambda: list_response(rid, model, data, prompt)

        return await self.run(request, "classify-", prepare)

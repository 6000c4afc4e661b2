"""What a backend serves: the APIs the gateway routes, and vLLM's default for each runner
and task.

What a backend serves is decided in this order (`app.lifecycle.served.Served`):
1. `endpoints:`, when listed, always;
2. else what the backend itself said it serves: the paths of its `GET /openapi.json`,
   read when it becomes ready and remembered across gateway restarts (`API_PATHS` maps
   them to these names);
3. else, when vLLM's docs are off (`--disable-fastapi-docs`: no `/openapi.json`) or
   before it was first ready, `task:` (`TASK_APIS`), or `runner:` (`RUNNER_APIS`).

vLLM 0.33 registers its routers by the model's supported tasks
(`vllm/entrypoints/launchers/api_server/routers.py`, `register_api_routers`): generate
-> chat, completions, responses (`vllm/entrypoints/generate/api_router.py`);
transcription -> audio (`vllm/entrypoints/speech_to_text/factories.py`); pooling by task
(`vllm/entrypoints/pooling/factories.py`, `register_pooling_api_routers`): `/pooling` for
any pooling task, `/classify` only for `classify`, `/v1/embeddings` only for `embed` (or
`token_embed`), `/score` and `/rerank` only for `embed`/`token_embed` or a `classify`
model with `num_labels == 1` (`vllm/entrypoints/pooling/utils.py`, `enable_scoring_api`);
`/tokenize` and `/detokenize` for every model. A request for an API its backend does not
serve is answered 404 `endpoint_not_served` by the gateway (or passed to the next entry
of a fallback chain), never sent to an upstream that would 404 it. (vLLM 0.33 registers
its routers in `vllm/entrypoints/launchers/api_server/routers.py`, `register_api_routers`.)

`runner:` takes vLLM's `--runner` values that serve requests (`generate`, `pooling`;
vllm/config/model.py `RunnerOption`, vllm/config/scheduler.py `RunnerType`). A
transcription-only model (Whisper) runs on vLLM's generate runner with the
`transcription` task: `task: transcription`; the old `runner: transcription` is read as
that, with a deprecation warning.

`messages` (Anthropic's `/v1/messages` and `/v1/messages/count_tokens`): vLLM 0.33
registers both for every generate model (`vllm/entrypoints/generate/api_router.py`,
`register_generate_api_routers` attaches `vllm/entrypoints/anthropic/api_router.py`), so a
generate backend gets them passed through; `messages: translate` says its image is older
(it serves them as chat), `messages: native` that it serves them whatever else it says
(`with_messages` is the one place that applies it, to the learned set and to the task's).
A backend without `messages` still answers `/v1/messages`: the gateway translates to and
from `chat`. `speech` and `images` are served by no vLLM runner: a backend that speaks
them lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Final, Literal


class Api(StrEnum):
    CHAT = "chat"  # /v1/chat/completions
    COMPLETIONS = "completions"  # /v1/completions
    EMBEDDINGS = "embeddings"  # /v1/embeddings
    RESPONSES = "responses"  # /v1/responses (+ /{id}, /{id}/cancel)
    MESSAGES = "messages"  # Anthropic's /v1/messages (+ /count_tokens)
    TOKENIZE = "tokenize"  # /tokenize
    DETOKENIZE = "detokenize"  # /detokenize
    RERANK = "rerank"  # /rerank, /v1/rerank, /v2/rerank
    SCORE = "score"  # /score, /v1/score
    POOLING = "pooling"  # /pooling
    CLASSIFY = "classify"  # /classify
    TRANSCRIPTIONS = "transcriptions"  # /v1/audio/transcriptions
    TRANSLATIONS = "translations"  # /v1/audio/translations
    SPEECH = "speech"  # /v1/audio/speech
    IMAGES = "images"  # /v1/images/generations, /v1/images/edits
    # Ollama's /api/chat, /api/generate, /api/embed: always translated by the gateway
    # (app.api.ollama) to chat or embeddings; no backend serves it (`endpoints:` refuses it).
    OLLAMA = "ollama"


Runner = Literal["generate", "pooling"]
# vLLM's supported tasks that serve requests (vllm/tasks.py `GenerationTask`, `PoolingTask`).
Task = Literal["generate", "transcription", "embed", "classify", "token_embed", "token_classify"]
# How a backend answers Anthropic's Messages API: `auto` as it serves (vLLM 0.33 does on
# generate models), `native` passed through, `translate` as chat (`with_messages`).
MessagesMode = Literal["auto", "native", "translate"]

_TOKENIZER: Final = frozenset({Api.TOKENIZE, Api.DETOKENIZE})
RUNNER_APIS: Final[dict[str, frozenset[Api]]] = {
    # vllm/entrypoints/generate/api_router.py: chat, completions, responses and (the
    # anthropic router it attaches) messages.
    "generate": _TOKENIZER | {Api.CHAT, Api.COMPLETIONS, Api.RESPONSES, Api.MESSAGES},
    # Without `task:` a pooling model may be any of them: every pooling route.
    "pooling": _TOKENIZER | {Api.EMBEDDINGS, Api.POOLING, Api.CLASSIFY, Api.SCORE, Api.RERANK},
}
_SCORING: Final = frozenset({Api.SCORE, Api.RERANK})
TASK_APIS: Final[dict[str, frozenset[Api]]] = {
    "generate": RUNNER_APIS["generate"],
    "transcription": _TOKENIZER | {Api.TRANSCRIPTIONS, Api.TRANSLATIONS},
    "embed": _TOKENIZER | {Api.EMBEDDINGS, Api.POOLING} | _SCORING,
    "token_embed": _TOKENIZER | {Api.EMBEDDINGS, Api.POOLING} | _SCORING,
    # `/score` and `/rerank` too only with `num_labels == 1` (a cross-encoder reranker):
    # learned from its /openapi.json, or listed under `endpoints:`.
    "classify": _TOKENIZER | {Api.CLASSIFY, Api.POOLING},
    "token_classify": _TOKENIZER | {Api.POOLING},
}
TASK_RUNNER: Final[dict[str, Runner]] = {
    "generate": "generate",
    "transcription": "generate",
    "embed": "pooling",
    "token_embed": "pooling",
    "classify": "pooling",
    "token_classify": "pooling",
}


def served_apis(value: list[Api] | None) -> list[Api] | None:
    """`endpoints:` as listed, refusing `ollama`: the gateway answers Ollama's API itself."""
    if value is not None and Api.OLLAMA in value:
        raise ValueError(
            "ollama is not an API a backend or provider serves: the gateway answers Ollama's "
            "/api/* itself, translated to chat and embeddings; leave it out"
        )
    return value


def with_messages(apis: frozenset[Api], mode: MessagesMode) -> frozenset[Api]:
    """What a backend serves once its `messages:` is applied to what it says or its task
    says (`auto`: as they say)."""
    if mode == "translate":
        return apis - {Api.MESSAGES}
    if mode == "native":
        return apis | {Api.MESSAGES}
    return apis


# What an OpenAI-compatible cloud provider is asked for (vLLM's own extras are not OpenAI's).
OPENAI_PROVIDER_APIS: Final = frozenset(
    {
        Api.CHAT,
        Api.COMPLETIONS,
        Api.EMBEDDINGS,
        Api.RESPONSES,
        Api.TRANSCRIPTIONS,
        Api.TRANSLATIONS,
        Api.SPEECH,
        Api.IMAGES,
    }
)
# Anthropic's provider: chat (translated) and messages (passed through).
ANTHROPIC_PROVIDER_APIS: Final = frozenset({Api.CHAT, Api.MESSAGES})


# The paths of a vLLM `/openapi.json` that are these APIs (the rest: not routed by model).
API_PATHS: Final[dict[str, Api]] = {
    "/v1/chat/completions": Api.CHAT,
    "/v1/completions": Api.COMPLETIONS,
    "/v1/embeddings": Api.EMBEDDINGS,
    "/v1/responses": Api.RESPONSES,
    "/v1/messages": Api.MESSAGES,
    "/tokenize": Api.TOKENIZE,
    "/detokenize": Api.DETOKENIZE,
    "/rerank": Api.RERANK,
    "/v1/rerank": Api.RERANK,
    "/v2/rerank": Api.RERANK,
    "/score": Api.SCORE,
    "/v1/score": Api.SCORE,
    "/pooling": Api.POOLING,
    "/classify": Api.CLASSIFY,
    "/v1/audio/transcriptions": Api.TRANSCRIPTIONS,
    "/v1/audio/translations": Api.TRANSLATIONS,
    "/v1/audio/speech": Api.SPEECH,
    "/v1/images/generations": Api.IMAGES,
    "/v1/images/edits": Api.IMAGES,
}


def apis_of_paths(paths: Iterable[str]) -> frozenset[Api]:
    """The APIs a server serves, from the paths its `/openapi.json` lists."""
    return frozenset(API_PATHS[p] for p in paths if p in API_PATHS)

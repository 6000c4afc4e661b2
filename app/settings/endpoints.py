"""What a backend serves: the APIs the gateway routes, and vLLM's default for each runner.

A backend's `endpoints:` lists APIs by these names; without it, `runner:` picks vLLM's
set for that runner. vLLM registers a router only for the tasks its model supports
(`vllm/entrypoints/openai/api_server.py`, `build_app`: generate -> chat, completions,
responses; embed/classify/score -> the pooling routes; transcription -> audio), and
`/tokenize` and `/detokenize` for every model. A request for an API its backend does not
serve is answered 404 `endpoint_not_served` by the gateway (or passed to the next entry
of a fallback chain), never sent to an upstream that would 404 it. (vLLM 0.33 registers
its routers in `vllm/entrypoints/launchers/api_server/routers.py`, `register_api_routers`.)

`messages` (Anthropic's `/v1/messages` and `/v1/messages/count_tokens`): vLLM 0.33
registers both for every generate model (`vllm/entrypoints/generate/api_router.py`,
`register_generate_api_routers` attaches `vllm/entrypoints/anthropic/api_router.py`), so a
generate backend gets them passed through unless its `messages: translate` says its
image is older; `native_messages` is the one place that decides. A backend without
`messages` still answers `/v1/messages`: the gateway translates to and from `chat`.
`speech` and `images` are served by no vLLM runner: a backend that speaks them lists them.
"""

from __future__ import annotations

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


Runner = Literal["generate", "pooling", "transcription"]
# How a backend answers Anthropic's Messages API: `auto` as its runner says (vLLM 0.33
# serves it on generate models), `native` passed through, `translate` as chat.
MessagesMode = Literal["auto", "native", "translate"]

_TOKENIZER: Final = frozenset({Api.TOKENIZE, Api.DETOKENIZE})
RUNNER_APIS: Final[dict[str, frozenset[Api]]] = {
    "generate": _TOKENIZER | {Api.CHAT, Api.COMPLETIONS, Api.RESPONSES},
    "pooling": _TOKENIZER | {Api.EMBEDDINGS, Api.POOLING, Api.CLASSIFY, Api.SCORE, Api.RERANK},
    "transcription": _TOKENIZER | {Api.TRANSCRIPTIONS, Api.TRANSLATIONS},
}


def native_messages(runner: Runner, mode: MessagesMode = "auto") -> bool:
    """Whether a backend without `endpoints:` answers `/v1/messages` (+ `count_tokens`)
    itself, so the gateway passes those requests through rather than translating them to
    chat. `auto`: a generate runner does (vLLM 0.33, module docstring); older vLLM images
    ran Anthropic as a separate server, hence `translate`. The one place this is decided:
    routes discovered from a backend later feed it here."""
    if mode == "auto":
        return runner == "generate"
    return mode == "native"


def runner_apis(runner: Runner, mode: MessagesMode = "auto") -> frozenset[Api]:
    """What a backend without `endpoints:` serves: its runner's set, with `messages` when
    it answers them natively (`native_messages`)."""
    apis = RUNNER_APIS[runner]
    return apis | {Api.MESSAGES} if native_messages(runner, mode) else apis


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

"""What a backend serves: the APIs the gateway routes, and vLLM's default for each runner.

A backend's `endpoints:` lists APIs by these names; without it, `runner:` picks vLLM's
set for that runner. vLLM registers a router only for the tasks its model supports
(`vllm/entrypoints/openai/api_server.py`, `build_app`: generate -> chat, completions,
responses; embed/classify/score -> the pooling routes; transcription -> audio), and
`/tokenize` and `/detokenize` for every model. A request for an API its backend does not
serve is answered 404 `endpoint_not_served` by the gateway (or passed to the next entry
of a fallback chain), never sent to an upstream that would 404 it.

`messages` (Anthropic's `/v1/messages`), `speech` and `images` are served by no vLLM
runner by default: a backend that speaks them lists them. A backend without `messages`
still answers `/v1/messages`: the gateway translates to and from `chat`.
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

_TOKENIZER: Final = frozenset({Api.TOKENIZE, Api.DETOKENIZE})
RUNNER_APIS: Final[dict[str, frozenset[Api]]] = {
    "generate": _TOKENIZER | {Api.CHAT, Api.COMPLETIONS, Api.RESPONSES},
    "pooling": _TOKENIZER | {Api.EMBEDDINGS, Api.POOLING, Api.CLASSIFY, Api.SCORE, Api.RERANK},
    "transcription": _TOKENIZER | {Api.TRANSCRIPTIONS, Api.TRANSLATIONS},
}

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

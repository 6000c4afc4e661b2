"""An opened upstream answer on its way back to an Ollama client: a chat completion's
stream as NDJSON (`app.ollama.stream`), a whole chat completion or embeddings answer read
and translated (`app.ollama.answers`), an error answer as Ollama's `{"error": "..."}`."""

from __future__ import annotations

from collections.abc import Callable

from app.ollama import answers
from app.ollama.stream import NdjsonStream, NdjsonTranslator
from app.ollama.wire import Json, error_body
from app.upstreams.anthropic.bodies import whole_answer
from app.upstreams.http import BufferedResponse, Relayable

# `(seconds since the request began, seconds it waited for its backend)`, on each call.
Clock = Callable[[], tuple[float, float]]


async def chat_answer(
    response: Relayable, within_s: float, *, model: str, generate: bool, clock: Clock, images: int
) -> Relayable:
    """A chat completion as `/api/chat`'s answer (or `/api/generate`'s), named `model`."""
    if response.status == 200 and response.is_event_stream:
        return NdjsonStream(response, NdjsonTranslator(model, generate=generate, clock=clock))

    def answer(body: Json) -> Json:
        return answers.chat_answer(body, model=model, generate=generate, timing=_timing(clock))

    return await _whole(response, within_s, answer, _envelope(model, images), "a chat completion")


async def embed_answer(
    response: Relayable, within_s: float, *, model: str, clock: Clock
) -> Relayable:
    """An embeddings answer as `/api/embed`'s, named `model`."""

    def answer(body: Json) -> Json:
        return answers.embed_answer(body, model=model, timing=_timing(clock))

    return await _whole(response, within_s, answer, _envelope(model, 0), "an embeddings answer")


def _timing(clock: Clock) -> answers.Timing:
    """The answer's durations, read when it is translated."""
    total, load = clock()
    return answers.Timing(total=total, load=load, prompt=0.0)


def _envelope(model: str, images: int) -> Callable[[int, bytes], Json]:
    def envelope(status: int, body: bytes) -> Json:
        message = answers.error_message(status, body)
        if (images and 400 <= status < 500) or (images and status >= 500 and "image" in message):
            message = (
                f"model '{model}' did not take the {images} image(s) of this request (a model "
                f"without vision cannot): {message}"
            )
        return error_body(message)

    return envelope


async def _whole(
    response: Relayable,
    within_s: float,
    answer: Callable[[Json], Json],
    envelope: Callable[[int, bytes], Json],
    what: str,
) -> BufferedResponse:
    return await whole_answer(response, within_s, envelope=envelope, translate=answer,
                              who="the upstream", what=what)  # fmt: skip

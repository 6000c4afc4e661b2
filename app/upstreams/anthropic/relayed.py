"""An upstream event stream relayed to the client in the other API's events, chunk by
chunk as the relay reads it: the part `MessagesStream` (OpenAI chunks served as Messages
events, inbound_relay.py) and `AnthropicStream` (Messages events served as OpenAI chunks,
provider.py) share. Each says how one upstream chunk translates (`_translate`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from app.anthropic.stream import SseParser
from app.upstreams.anthropic.bodies import SSE_TYPE
from app.upstreams.http import Relayable


class Translating(Protocol):
    """What a stream translator says of itself (stream.py, inbound_stream.py)."""

    @property
    def done(self) -> bool: ...
    @property
    def failed(self) -> bool: ...
    def finish(self) -> list[bytes]: ...


class TranslatedStream:
    """The relay's view of a translated stream (`Relayable`): 200, events, read once."""

    status = 200
    is_event_stream = True

    def __init__(self, response: Relayable, translator: Translating) -> None:
        self._response = response
        self._translator = translator
        self._parser = SseParser()
        self._chunks = response.rest()  # after its first chunk; read by one owner
        self.headers: list[tuple[bytes, bytes]] = [(b"content-type", SSE_TYPE)]
        self.first_chunk = b""

    @property
    def complete(self) -> bool:
        return self._translator.done

    @property
    def failed(self) -> bool:
        """The client got (or will get) an in-band error instead of a whole answer."""
        return self._translator.failed

    def _translate(self, chunk: bytes) -> bytes:
        raise NotImplementedError

    async def rest(self) -> AsyncIterator[bytes]:
        if self._translator.done:
            return
        async for chunk in self._chunks:
            out = self._translate(chunk)
            if out:
                yield out
            if self._translator.done:
                return
        tail = b"".join(self._translator.finish())
        if tail:
            yield tail

    def release(self) -> None:
        self._response.release()


class ChunkTranslating(Translating, Protocol):
    """A translator fed the data of each OpenAI chunk event (`data: {...}`)."""

    def feed(self, data: str) -> list[bytes]: ...


class ChunksTranslated(TranslatedStream):
    """An OpenAI chunk stream served in another API's stream (`MessagesStream`, Ollama's
    `NdjsonStream`): each event's data to the translator, until it is done."""

    _translator: ChunkTranslating

    def _translate(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for _event, data in self._parser.feed(chunk):
            out.extend(self._translator.feed(data))
            if self._translator.done:
                break
        return b"".join(out)

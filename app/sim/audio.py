"""Audio endpoints of the fake vLLM server.

* ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: multipart/form-data as
  vLLM's ``vllm/entrypoints/openai/speech_to_text/protocol.py`` parses it (``file``,
  ``model``, ``language``, ``prompt``, ``response_format`` json|text|verbose_json,
  ``temperature``, ``stream``, ``stream_include_usage``, ``stream_continuous_usage_stats``).
  ``json`` -> ``TranscriptionResponse`` ``{"text", "usage": {"type": "duration",
  "seconds"}}`` (translations: ``{"text"}``); ``text`` -> the text as text/plain;
  ``verbose_json`` -> ``TranscriptionResponseVerbose`` (duration as a string, language,
  text, one segment). ``stream=true`` -> SSE of ``TranscriptionStreamResponse`` chunks
  (``object`` ``transcription.chunk`` / ``translation.chunk``, one word per ``delta``, the
  last with ``finish_reason`` ``stop``), the usage chunk with ``stream_include_usage``, then
  ``data: [DONE]``.
* ``POST /v1/audio/speech``: not served by vLLM; OpenAI's shape (JSON ``model``, ``input``,
  ``voice``, ``response_format``), as vLLM-Omni-like servers serve it: a WAV (16-bit mono
  24 kHz), streamed in several writes, 50 ms of audio per input character.

The transcript is derived from the upload alone, deterministically: ``"fake transcript of a
<size> byte file <hex of its first 4 bytes>"``; its duration assumes 16 kHz 16-bit mono (32000
bytes a second, at least 1). Words are tokens, timed and faulted like chat streaming.
On purpose different from vLLM: ``srt``/``vtt`` and speech formats other than ``wav``/
``pcm`` are refused (400); the audio is not decoded.
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
import uuid
from typing import Any

from aiohttp import BodyPartReader, web

from app.sim.generation import GenerationApi
from app.sim.state import FakeState, RequestRun, error_response, json_response
from app.sim.text import DONE_EVENT, ApiError, dumps, validation_error

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
_FORMATS = ("json", "text", "verbose_json")
_BYTES_PER_SECOND = 32000  # 16 kHz, 16-bit mono
_SPEECH_RATE = 24000
_SAMPLES_PER_CHAR = _SPEECH_RATE // 20  # 50 ms
_CHUNK = 8192


def transcript(data: bytes) -> str:
    """The fake's transcript of an upload: from its size and first bytes only."""
    return f"fake transcript of a {len(data)} byte file {data[:4].hex() or 'empty'}"


def wav_header(data_bytes: int, rate: int = _SPEECH_RATE) -> bytes:
    """A 44-byte PCM WAV header (mono, 16-bit) for ``data_bytes`` of samples."""
    return b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE" + b"fmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16
    ) + b"data" + struct.pack("<I", data_bytes)  # fmt: skip


def _text(raw: bytes) -> str:
    """A form field's text: UTF-8, else latin-1 (Starlette's `_user_safe_decode`)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _bool_field(form: dict[str, Any], key: str) -> bool:
    value = form.get(key)
    if value is None:
        return False
    text = str(value).lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise validation_error([key], "bool_parsing", "Input should be a valid boolean")


class AudioApi:
    """Transcription, translation and speech endpoints of one fake server."""

    def __init__(self, state: FakeState, gen: GenerationApi) -> None:
        self.state = state
        self.gen = gen

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        return await self._speech_to_text(request, translate=False)

    async def translations(self, request: web.Request) -> web.StreamResponse:
        return await self._speech_to_text(request, translate=True)

    async def _form(self, request: web.Request) -> tuple[dict[str, Any], bytes]:
        """Form fields (strings) and the uploaded file; records the request."""
        form: dict[str, Any] = {}
        data: bytes | None = None
        if request.content_type.startswith("multipart/"):
            # Part by part, so a text field that is not UTF-8 is read as Starlette (vLLM's
            # server) reads it, latin-1, rather than failing in aiohttp's `post()`.
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader) or part.name is None:
                    continue
                raw = await part.read(decode=False)
                if part.filename is not None:
                    if part.name == "file":
                        data = bytes(raw)
                        form["file"] = {"filename": part.filename, "size": len(data)}
                else:
                    form[part.name] = _text(bytes(raw))
        elif request.content_type.endswith("x-www-form-urlencoded"):
            for key, value in (await request.post()).items():
                form[key] = str(value)
        self.state.record(request, form)
        if data is None:
            if isinstance(form.get("file"), str):
                msg = "Expected 'file' to be a file-like object, not 'str'."
                raise ApiError(422, msg, "UnprocessableEntityError", "file")
            raise validation_error(["file"], "missing", "Field required")
        return form, data

    async def _speech_to_text(self, request: web.Request, translate: bool) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            form, data = await self._form(request)
            model = state.resolve_model(form)
            fmt = form.get("response_format") or "json"
            if fmt not in (*_FORMATS, "srt", "vtt"):
                msg = "Input should be 'json', 'text', 'srt', 'verbose_json' or 'vtt'"
                raise validation_error(["response_format"], "literal_error", msg)
            if fmt not in _FORMATS:
                msg = f"response_format {fmt!r} is not supported by the fake vLLM server."
                raise ApiError(400, msg, param="response_format")
            temperature = form.get("temperature")
            if temperature is not None:
                try:
                    float(temperature)
                except ValueError:
                    msg = "Input should be a valid number, unable to parse string as a number"
                    raise validation_error(["temperature"], "float_parsing", msg) from None
            stream = _bool_field(form, "stream")
            include_usage = _bool_field(form, "stream_include_usage")
            continuous = _bool_field(form, "stream_continuous_usage_stats")
            if (include_usage or continuous) and not stream:
                msg = "Stream options can only be defined when `stream=True`."
                param = "stream_include_usage" if include_usage else "stream_continuous_usage_stats"
                raise ApiError(400, msg, param=param)
        except ApiError as err:
            return error_response(err)
        words = transcript(data).split()
        texts = [w if i == 0 else " " + w for i, w in enumerate(words)]
        seconds = max(1, math.ceil(len(data) / _BYTES_PER_SECOND))
        prompt = max(len(form.get("prompt", "").split()), 1)
        if stream:
            kind = "translation" if translate else "transcription"
            rid = ("trsl-" if translate else "trsc-") + uuid.uuid4().hex
            head = {"id": rid, "object": f"{kind}.chunk", "created": int(time.time())}
            head["model"] = model

            async def streaming(run: RequestRun) -> web.StreamResponse:
                return await self._stream(request, run, head, texts, prompt, include_usage)

            return await state.admit(arrival, streaming)

        async def complete(run: RequestRun) -> web.StreamResponse:
            await self.gen.pacing(run).last(len(texts))
            if run.job.aborted:
                return error_response(ApiError(500, "Request aborted.", "InternalServerError"))
            state.first_token(run, prompt)
            run.tokens = len(texts)
            run.outcome = "stop"
            text = "".join(texts)
            if fmt == "text":
                return web.Response(text=text, content_type="text/plain")
            if fmt == "verbose_json":
                return json_response(dumps(self._verbose(form, text, seconds)))
            if translate:
                return json_response(dumps({"text": text}))
            usage = {"type": "duration", "seconds": seconds}
            return json_response(dumps({"text": text, "usage": usage}))

        return await state.admit(arrival, complete)

    @staticmethod
    def _verbose(form: dict[str, Any], text: str, seconds: int) -> dict[str, Any]:
        segment = {
            "id": 0,
            "avg_logprob": -0.1,
            "compression_ratio": 1.0,
            "end": float(seconds),
            "no_speech_prob": 0.0,
            "seek": 0,
            "start": 0.0,
            "temperature": float(form.get("temperature") or 0.0),
            "text": text,
            "tokens": list(range(100, 100 + len(text.split()))),
        }
        return {
            "duration": str(float(seconds)),
            "language": form.get("language") or "en",
            "text": text,
            "segments": [segment],
            "words": None,
        }

    async def _stream(
        self,
        request: web.Request,
        run: RequestRun,
        head: dict[str, Any],
        texts: list[str],
        prompt: int,
        include_usage: bool,
    ) -> web.StreamResponse:
        job, gen = run.job, self.gen
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            pacing = await gen.started(request, run, resp)
            if pacing is None:
                return resp
            if not job.aborted:
                self.state.first_token(run, prompt)
            last = len(texts) - 1
            for i, text in enumerate(texts):
                await pacing.token(i)
                if job.aborted:
                    break
                run.tokens += 1
                choice: dict[str, Any] = {"delta": {"content": text}}
                if i == last:
                    choice |= {"finish_reason": "stop", "stop_reason": None}
                chunk = b"data: " + dumps({**head, "choices": [choice]}) + b"\n\n"
                if not await gen.send(request, resp, run, chunk):
                    return resp
            finish = "abort" if job.aborted else "stop"
            if include_usage:
                usage = {
                    "prompt_tokens": prompt,
                    "total_tokens": prompt + run.tokens,
                    "completion_tokens": run.tokens,
                }
                chunk = b"data: " + dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
                if not await gen.send(request, resp, run, chunk):
                    return resp
            await resp.write(DONE_EVENT)
            run.outcome = finish
        except ConnectionResetError:
            pass
        return resp

    # --- text to speech (OpenAI's shape; vLLM-Omni-like servers) -----------------------------

    async def speech(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        state = self.state
        try:
            body = await state.parse_body(request)
            model = state.resolve_model(body)
            text = body.get("input")
            if text is None:
                raise validation_error(["input"], "missing", "Field required")
            if not isinstance(text, str):
                raise validation_error(["input"], "string_type", "Input should be a valid string")
            if not text:
                raise ApiError(400, "input must not be empty.", param="input")
            voice = body.get("voice")
            if voice is not None and not isinstance(voice, str):
                raise validation_error(["voice"], "string_type", "Input should be a valid string")
            fmt = body.get("response_format") or "wav"
            if fmt not in ("wav", "pcm"):
                msg = f"response_format {fmt!r} is not supported by the fake server (wav, pcm)."
                raise ApiError(400, msg, param="response_format")
        except ApiError as err:
            return error_response(err)
        samples = len(text) * _SAMPLES_PER_CHAR
        seed = sum(map(ord, model + (voice or ""))) % 7 + 2

        async def work(run: RequestRun) -> web.StreamResponse:
            loop = asyncio.get_running_loop()
            await state.engine.wait_until(run.job, loop.time() + state.faults.ttft)
            if run.job.aborted:
                return error_response(ApiError(500, "Request aborted.", "InternalServerError"))
            state.first_token(run, max(len(text.split()), 1))
            content_type = "audio/wav" if fmt == "wav" else "audio/pcm"
            resp = web.StreamResponse(headers={"Content-Type": content_type})
            try:
                await resp.prepare(request)
                if fmt == "wav":
                    await resp.write(wav_header(samples * 2))
                tone = [int(8000 * math.sin(2 * math.pi * seed * k / 64)) for k in range(64)]
                period = struct.pack("<64h", *tone)
                pcm = (period * (samples // 64 + 1))[: samples * 2]
                for offset in range(0, len(pcm), _CHUNK):
                    await resp.write(pcm[offset : offset + _CHUNK])
                    run.tokens += 1
                await resp.write_eof()
                run.outcome = "stop"
            except ConnectionResetError:
                pass
            return resp

        return await state.admit(arrival, work)

"""Ollama's API in OpenAI's words, and back: what the gateway's `/api/*` (`app.api.ollama`)
needs to serve Ollama's clients from vLLM's OpenAI-compatible server.

    wire       Ollama's conventions (durations, timestamps, `keep_alive`, `model:tag`)
    requests   `/api/chat`, `/api/generate`, `/api/embed` as chat completions and embeddings
    answers    a whole chat completion or embeddings answer as Ollama's
    stream     a chat completion's event stream as Ollama's NDJSON lines
    relayed    an opened upstream answer, whole or a stream, translated on its way back

The upstream call is shaped in `app.routing.translation` (the only user of `requests`):
the API reads the request and picks the translation.
"""

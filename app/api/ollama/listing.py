"""`GET /api/tags`, `GET /api/ps` and `POST /api/show` from the registry and the backends
(pure: read at the moment of the request, no I/O).

Shapes are Ollama's (api/types.go at ollama/ollama fb3076099: `ListModelResponse` :822,
`ProcessModelResponse` :836, `ShowResponse` :736, `ModelDetails` :932):
- `size` is the model's VRAM footprint (what admission counts for its backend:
  `vram_mib`, a profile's share or the planner's estimate), in bytes, over its GPUs;
  0 when the gateway has none;
- `/api/ps` lists the models whose backend is `ready` (loaded and answering, as Ollama's
  `ps` lists loaded runners); a sleeping backend holds little or nothing of its weights
  on the GPU and is not listed. `size_vram` is what it holds now (`held_mib`, measured
  at its start where the GPU could be read). `expires_at` is when its idle stop comes
  (`idle_stop_in_s`); a backend that has none counting down (pinned, no `idle_ttl_s`,
  busy, kept warm) gets `FOREVER_AT`, far in the future, as Ollama's own "forever";
- the digest is a stable sha256 of the served id (there is no Ollama manifest).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Final

from app.gpu.telemetry import MIB
from app.lifecycle.backend import Backend
from app.lifecycle.state import BackendState
from app.ollama.wire import Json, tagged, timestamp
from app.routing.registry import ModelEntry

# Far in the future, as a Go time for "forever" (Ollama keeps a runner with a negative
# keep_alive for `math.MaxInt64` ns, server/sched.go; ~292 years).
FOREVER_AT: Final = 4102444800.0  # 2100-01-01T00:00:00Z
_EMBED_TASKS: Final = frozenset({"embed", "token_embed"})


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def details(backend: Backend | None) -> Json:
    info = None if backend is None else backend.config.model_info
    params = None if info is None else info.params_b
    dtype = None if info is None else info.weights_dtype
    return {
        "parent_model": "",
        "format": "",
        "family": "",
        "families": None,
        "parameter_size": "" if params is None else f"{params:g}B",
        "quantization_level": "" if dtype is None else dtype.upper(),
    }


def footprint_bytes(backend: Backend | None) -> int:
    if backend is None or backend.memory.vram_mib is None:
        return 0
    return backend.memory.vram_mib * MIB * max(1, len(backend.memory.gpus))


def held_bytes(backend: Backend) -> int:
    held = backend.memory.held_mib
    return 0 if held is None else held * MIB * max(1, len(backend.memory.gpus))


def tags(
    entries: tuple[ModelEntry, ...],
    backends: Mapping[str, Backend],
    *,
    allowed: Callable[[str], bool],
    modified_at: float,
) -> Json:
    models = []
    for entry in entries:
        if not allowed(entry.id):
            continue
        backend = backends.get(entry.backend)
        name = tagged(entry.id)
        models.append({
            "name": name,
            "model": name,
            "modified_at": timestamp(modified_at),
            "size": footprint_bytes(backend),
            "digest": digest(entry.id),
            "details": details(backend),
        })  # fmt: skip
    return {"models": models}


def ps(
    entries: tuple[ModelEntry, ...],
    backends: Mapping[str, Backend],
    *,
    allowed: Callable[[str], bool],
    max_len: Callable[[ModelEntry], int | None],
    now: float | None = None,
) -> Json:
    at = time.time() if now is None else now
    models = []
    for entry in entries:
        backend = backends.get(entry.backend)
        if backend is None or backend.state is not BackendState.READY or not allowed(entry.id):
            continue
        left = backend.requests.idle_stop_in_s()
        name = tagged(entry.id)
        models.append({
            "name": name,
            "model": name,
            "size": footprint_bytes(backend) or held_bytes(backend),
            "digest": digest(entry.id),
            "details": details(backend),
            "expires_at": timestamp(FOREVER_AT if left is None else at + left),
            "size_vram": held_bytes(backend),
            "context_length": max_len(entry) or 0,
        })  # fmt: skip
    models.sort(key=lambda m: str(m["expires_at"]), reverse=True)  # longest left first
    return {"models": models}


def show(
    entry: ModelEntry, backend: Backend | None, *, max_len: int | None, modified_at: float
) -> Json:
    """`POST /api/show`: what the gateway knows of the model; `capabilities` from what
    its backend serves (`completion` for chat, `embedding` for embeddings)."""
    apis = set() if backend is None else {str(api) for api in backend.serving.apis}
    task = None if backend is None else backend.config.task
    capabilities = []
    if "chat" in apis:
        capabilities.append("completion")
    if "embeddings" in apis or task in _EMBED_TASKS:
        capabilities.append("embedding")
    served_by = entry.group or entry.backend
    info: Json = {"general.architecture": "", "general.basename": entry.root}
    if max_len is not None:
        info["general.context_length"] = max_len
    return {
        "license": "",
        "modelfile": f"# served by microscheduler ({served_by})\nFROM {entry.root}\n",
        "parameters": "",
        "template": "",
        "details": details(backend),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": timestamp(modified_at),
    }

"""What a vLLM server says about itself when it becomes ready, parsed (pure, no I/O).

- Its routes: the paths and methods of `GET /openapi.json`, which FastAPI builds from
  the routers vLLM registered for the model's tasks (vLLM 0.33
  `vllm/entrypoints/launchers/api_server/routers.py`). A server started with
  `--disable-fastapi-docs` has none (`vllm/entrypoints/launchers/app.py` builds the app
  with `openapi_url=None`): then `routes` is None and the configuration decides.
- Its `max_model_len`: the `max_model_len` of its model card in `GET /v1/models`
  (`vllm/entrypoints/openai/models/serving.py`: base models carry it, LoRA adapters not).
- The model ids it lists there (`Answer.models`): a start is ready only on a server that
  lists the backend's own (`not_ours`), not on another server that answers on its port.

`VllmClient.learn` does the I/O; `app.lifecycle.served` keeps what was learned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

# FastAPI's operations are the lower-case HTTP methods under each path.
_METHODS: Final = frozenset({"get", "post", "put", "patch", "delete"})
# At most this many paths are kept (a vLLM lists ~60): a document beyond is not vLLM's.
MAX_PATHS: Final = 1000
_MAX_PATH_CHARS: Final = 300
_PARAM: Final = re.compile(r"\{[^/{}]+\}")


class LearnError(Exception):
    """A document that is not what vLLM serves; the message says why."""


@dataclass(frozen=True, slots=True)
class Learned:
    """What a server said: its routes (`(METHOD, path template)`; None: no `/openapi.json`)
    and its `max_model_len` (None: not said)."""

    routes: frozenset[tuple[str, str]] | None
    max_model_len: int | None

    @property
    def paths(self) -> frozenset[str] | None:
        return None if self.routes is None else frozenset(p for _, p in self.routes)

    def serves_route(self, method: str, path: str) -> bool | None:
        """Whether `method path` (a concrete path: `/v1/responses/resp_1/input_items`) is
        one of its routes; None when its routes are not known."""
        if self.routes is None:
            return None
        concrete = path.split("?", 1)[0]
        return any(m == method and _matches(template, concrete) for m, template in self.routes)

    def methods_of(self, path: str) -> list[str]:
        """The methods of its routes at `path` (a concrete path), sorted; empty: none or
        not known."""
        concrete = path.split("?", 1)[0]
        return sorted({m for m, template in self.routes or () if _matches(template, concrete)})

    def to_json(self) -> dict[str, Any]:
        routes = None if self.routes is None else sorted([m, p] for m, p in self.routes)
        return {"routes": routes, "max_model_len": self.max_model_len}

    @classmethod
    def from_json(cls, data: object) -> Learned | None:
        """From `to_json`'s form; None for anything else (a state file from elsewhere)."""
        if not isinstance(data, Mapping):
            return None
        raw_routes, max_len = data.get("routes"), data.get("max_model_len")
        if max_len is not None and (type(max_len) is not int or max_len <= 0):
            return None
        if raw_routes is None:
            return cls(None, max_len)
        if not isinstance(raw_routes, list) or len(raw_routes) > MAX_PATHS:
            return None
        routes: set[tuple[str, str]] = set()
        for item in raw_routes:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not all(isinstance(v, str) for v in item)
            ):
                return None
            routes.add((item[0], item[1]))
        return cls(frozenset(routes), max_len)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a server answered to `VllmClient.learn`: what is kept of it (`learned`) and
    the ids of the model cards of its `/v1/models` (None: no model list: not 200, or not
    a list)."""

    learned: Learned
    models: tuple[str, ...] | None


# How many of a foreign server's model ids a reason names, and how much of each.
NAMED_MODELS: Final = 3
_MODEL_ID_CHARS: Final = 80


def models_of(body: bytes) -> tuple[str, ...] | None:
    """The ids of the model cards of a `GET /v1/models` body (`{"data": [{"id": ...}]}`);
    None when it is not such a list. vLLM lists one card per `--served-model-name` (the
    model's path when none is given), then its LoRA adapters
    (vllm/entrypoints/openai/models/serving.py:64 and :149,
    vllm/entrypoints/launchers/api_server/app_state.py:59)."""
    cards = _model_cards(body)
    if cards is None:
        return None
    return tuple(card["id"] for card in cards if isinstance(card.get("id"), str))


def _model_cards(body: bytes) -> list[dict[str, Any]] | None:
    """The model cards of a `GET /v1/models` body (its `data` objects); None when it is
    not such a list."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    cards = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(cards, list):
        return None
    return [card for card in cards if isinstance(card, dict)]


def not_ours(models: tuple[str, ...] | None, served_model: str) -> str | None:
    """None when a server that lists `models` may be the backend's (it lists
    `served_model`, or gave no model list: not known); else what it lists instead,
    bounded (`'a', 'b', 'c' and 2 more`, or `no model` for an empty list)."""
    if models is None or served_model in models:
        return None
    if not models:
        return "no model"
    named = ", ".join(repr(_cut(m)) for m in models[:NAMED_MODELS])
    more = len(models) - NAMED_MODELS
    return named if more <= 0 else f"{named} and {more} more"


def _cut(text: str) -> str:
    return text if len(text) <= _MODEL_ID_CHARS else text[:_MODEL_ID_CHARS] + "..."


def _matches(template: str, path: str) -> bool:
    """A path against a FastAPI template (`/v1/responses/{response_id}`): segment by
    segment, a `{name}` segment matching any one non-empty segment."""
    want, got = template.split("/"), path.split("/")
    return len(want) == len(got) and all(
        w == g or (_PARAM.fullmatch(w) is not None and g != "")
        for w, g in zip(want, got, strict=True)
    )


def routes_of_openapi(body: bytes) -> frozenset[tuple[str, str]]:
    """`(METHOD, path)` of every operation of an OpenAPI document; `LearnError` when it
    is not one."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise LearnError(f"/openapi.json is not JSON: {exc}") from None
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict):
        raise LearnError("/openapi.json has no `paths` object")
    if len(paths) > MAX_PATHS:
        raise LearnError(f"/openapi.json lists {len(paths)} paths, more than {MAX_PATHS}")
    routes: set[tuple[str, str]] = set()
    for path, operations in paths.items():
        if not isinstance(path, str) or not path.startswith("/") or len(path) > _MAX_PATH_CHARS:
            continue
        if isinstance(operations, dict):
            routes.update((m.upper(), path) for m in operations if m in _METHODS)
    return frozenset(routes)


def max_model_len_of(body: bytes, model_ids: Iterable[str]) -> int | None:
    """The `max_model_len` of the first card of `GET /v1/models` whose id is one of
    `model_ids` (the backend's served name first), else of the first card that has one;
    None when none says."""
    cards = _model_cards(body)
    if cards is None:
        return None
    lengths: dict[str, int] = {}
    first: int | None = None
    for card in cards:
        value = card.get("max_model_len")
        if type(value) is not int or value <= 0:
            continue
        card_id = card.get("id")
        if isinstance(card_id, str):
            lengths.setdefault(card_id, value)
        if first is None:
            first = value
    for model_id in model_ids:
        if model_id in lengths:
            return lengths[model_id]
    return first

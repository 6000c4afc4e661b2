"""Model names to routes: which backend serves a name and which id goes upstream. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.settings import BackendConfig


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # the configured name the client used (a model id or an alias)
    backend: str
    upstream_model: str  # the backend's first model id, always what goes upstream

    @property
    def rewrites(self) -> bool:
        return self.name != self.upstream_model


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    backend: str
    root: str  # the upstream id an alias stands for
    is_alias: bool


class Registry:
    def __init__(self, routes: Mapping[str, Route], entries: list[ModelEntry]) -> None:
        self._routes = dict(routes)
        self.entries = tuple(entries)

    @classmethod
    def from_backends(cls, backends: Mapping[str, BackendConfig]) -> Registry:
        routes: dict[str, Route] = {}
        entries: list[ModelEntry] = []
        for backend, cfg in backends.items():
            upstream = cfg.served_model
            for name, is_alias in [(m, False) for m in cfg.models] + [
                (a, True) for a in cfg.aliases
            ]:
                if name in routes:
                    raise ValueError(f"model name {name!r} is configured twice")
                routes[name] = Route(name=name, backend=backend, upstream_model=upstream)
                entries.append(
                    ModelEntry(id=name, backend=backend, root=upstream, is_alias=is_alias)
                )
        return cls(routes, entries)

    def resolve(self, model: str) -> Route | None:
        return self._routes.get(model)

    def names_of(self, backend: str) -> list[str]:
        return [e.id for e in self.entries if e.backend == backend]

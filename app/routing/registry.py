"""Model names to routes: which backend serves a name and which id goes upstream. Pure.

A name listed by the backends of one replica group (`replica_of:`) routes to all of them
(`Route.replicas`); the dispatcher picks one per request (`app.routing.replicas`).
`Route.backend` is then the group's first member: the name logs and wake notices use
until a member is picked, and the one whose error a request gets when none can take it.

A LoRA adapter (`adapters:`) is a name of its own: its route sends the adapter's name
upstream (vLLM picks an adapter by `model`), with its path to load it (`Route.adapter`);
its entry names the base model's served id as `parent`, as vLLM's `/v1/models` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.settings import BackendConfig


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # the configured name the client used (a model id or an alias)
    backend: str  # the backend, or a replica group's first member
    upstream_model: str  # the backend's first model id, always what goes upstream
    replicas: tuple[str, ...] = ()  # a replica group's members listing the name, in order
    group: str | None = None  # the replica group (`replica_of`)
    adapter: str | None = None  # a LoRA adapter's path (`upstream_model` is its name)

    @property
    def rewrites(self) -> bool:
        return self.name != self.upstream_model

    @property
    def members(self) -> tuple[str, ...]:
        """The backends that may serve it: the group's members, or the one backend."""
        return self.replicas or (self.backend,)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    backend: str  # the backend, or a replica group's first member
    root: str  # the upstream id an alias stands for
    is_alias: bool
    group: str | None = None
    replicas: tuple[str, ...] = ()
    parent: str | None = None  # a LoRA adapter's base model (its served id)


class Registry:
    def __init__(self, routes: Mapping[str, Route], entries: list[ModelEntry]) -> None:
        self._routes = dict(routes)
        self.entries = tuple(entries)

    @classmethod
    def from_backends(cls, backends: Mapping[str, BackendConfig]) -> Registry:
        """One route and one entry per name; a name on several backends must be shared by
        replicas of one group (`Settings` validates it; checked again here)."""
        owners: dict[str, list[str]] = {}
        kinds: dict[str, bool] = {}
        for backend, cfg in backends.items():
            for name, is_alias in (
                [(m, False) for m in cfg.models]
                + [(a, True) for a in cfg.aliases]
                + [(a, False) for a in cfg.adapters]
            ):
                found = owners.setdefault(name, [])
                if backend in found:
                    raise ValueError(f"model name {name!r} is configured twice")
                if found:
                    group = backends[found[0]].replica_of
                    if group is None or backends[backend].replica_of != group:
                        raise ValueError(f"model name {name!r} is configured twice")
                found.append(backend)
                kinds.setdefault(name, is_alias)
        routes: dict[str, Route] = {}
        entries: list[ModelEntry] = []
        for name, members in owners.items():
            first = backends[members[0]]
            group = first.replica_of
            replicas = tuple(members) if group is not None else ()
            path = first.adapters.get(name)
            upstream = first.served_model if path is None else name
            parent = None if path is None else first.served_model
            routes[name] = Route(name, members[0], upstream, replicas, group, path)
            entries.append(
                ModelEntry(name, members[0], upstream, kinds[name], group, replicas, parent)
            )
        return cls(routes, entries)

    def resolve(self, model: str) -> Route | None:
        return self._routes.get(model)

    def names_of(self, backend: str) -> list[str]:
        return [e.id for e in self.entries if backend in (e.replicas or (e.backend,))]

from __future__ import annotations

import pytest

from app.routing.registry import Registry, Route
from app.settings import BackendConfig


def backend(url: str, models: list[str], aliases: list[str]) -> BackendConfig:
    return BackendConfig(url=url, models=models, aliases=aliases)


@pytest.fixture
def registry() -> Registry:
    return Registry.from_backends(
        {
            "orchestrator": backend("http://a:1", ["nemotron-8b", "nemotron"], ["default"]),
            "reasoning": backend("http://b:1", ["r1-14b"], ["reasoning"]),
        }
    )


def test_ids_and_aliases_route_to_the_first_model_id(registry: Registry) -> None:
    assert registry.resolve("nemotron-8b") == Route("nemotron-8b", "orchestrator", "nemotron-8b")
    assert registry.resolve("nemotron") == Route("nemotron", "orchestrator", "nemotron-8b")
    assert registry.resolve("default") == Route("default", "orchestrator", "nemotron-8b")
    assert registry.resolve("reasoning") == Route("reasoning", "reasoning", "r1-14b")


def test_only_names_that_differ_from_the_upstream_id_are_rewritten(registry: Registry) -> None:
    assert not registry.resolve("nemotron-8b").rewrites  # type: ignore[union-attr]
    assert registry.resolve("default").rewrites  # type: ignore[union-attr]


def test_unknown_names_do_not_resolve(registry: Registry) -> None:
    assert registry.resolve("gpt-4o") is None
    assert registry.resolve("") is None
    assert registry.resolve("Default") is None  # names are exact


def test_entries_list_every_name_once_in_config_order(registry: Registry) -> None:
    assert [(e.id, e.root, e.is_alias) for e in registry.entries] == [
        ("nemotron-8b", "nemotron-8b", False),
        ("nemotron", "nemotron-8b", False),
        ("default", "nemotron-8b", True),
        ("r1-14b", "r1-14b", False),
        ("reasoning", "r1-14b", True),
    ]
    assert registry.names_of("reasoning") == ["r1-14b", "reasoning"]


def test_a_name_configured_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="'x' is configured twice"):
        Registry.from_backends(
            {"a": backend("http://a:1", ["x"], []), "b": backend("http://b:1", ["y"], ["x"])}
        )

"""`hf_config:` of a backend: a Hugging Face `config.json` (or its folder), read once when
the configuration is loaded. `load_settings` makes relative paths in the YAML relative to
the config directory (`relative_to`) before validation; a `BackendConfig` built in code
takes its path as given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator

from app.planner.model_info import ModelInfo, model_from_hf_config


def config_json(path: Path) -> Path:
    """`path`, or the `config.json` in it when it is a folder."""
    return path / "config.json" if path.is_dir() else path


def read_hf_config(path: Path) -> ModelInfo:
    """Read a Hugging Face `config.json` (or the folder holding one); `ValueError` if unusable."""
    path = config_json(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"file not found: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must contain a JSON object")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_hf_config(data, name=name or "hf-config")


@dataclass(frozen=True)
class HfConfigFile:
    """A backend's `hf_config:` once read: where it was and what it says."""

    path: Path
    model: ModelInfo


def _load_hf_config(value: Any) -> Any:
    if value is None or isinstance(value, HfConfigFile | Mapping):
        return value  # already read (a Mapping: a dumped `HfConfigFile` validated again)
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("must be the path of a Hugging Face config.json (or its folder)")
    path = Path(value).expanduser()
    path = config_json(path)
    return HfConfigFile(path=path, model=read_hf_config(path))


HfConfigField = Annotated[HfConfigFile | None, BeforeValidator(_load_hf_config)]


def relative_to(directory: Path, backends: object) -> None:
    """Make the relative `hf_config:` paths of `models.yaml`'s raw `backends:` data
    relative to `directory` instead, in place (anything unexpected is left to validation)."""
    if not isinstance(backends, dict):
        return
    for backend in backends.values():
        value = backend.get("hf_config") if isinstance(backend, dict) else None
        if isinstance(value, str) and value.strip():
            path = Path(value).expanduser()
            if not path.is_absolute():
                backend["hf_config"] = str(directory / path)

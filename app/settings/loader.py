"""Loading the config directory: YAML files, environment, one `ConfigError` line per problem
naming the file (or variable), the key and the problem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from app.settings.hf_config import relative_to
from app.settings.root import (
    _ENV_ONLY,
    CLOUD_FILE,
    ENV_PREFIX,
    FLAGS,
    KEYS_FILE,
    MODELS_FILE,
    PROFILES_FILE,
    Settings,
)

# Settings fields filled from the optional files, never from models.yaml.
_FROM_OTHER_FILES = {
    "cloud_providers": CLOUD_FILE,
    "gpu_profiles": PROFILES_FILE,
    "client_keys": KEYS_FILE,
}


class ConfigError(Exception):
    """Invalid configuration; `problems` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# Every key of the four files, with a comment each: config/reference/ (and the JSON Schema
# of `microscheduler config schema`, which editors read).
UNKNOWN_KEY = "unknown key (check the spelling against config/reference/)"


def load_settings(
    config_dir: Path | str | None = None, *, models_file: Path | None = None, **overrides: Any
) -> Settings:
    """Read the config directory and the environment; raise `ConfigError` on any problem.

    `overrides` (from CLI flags) win over everything. All three sources are validated
    together, by every validator of `Settings` (a flag is checked like the YAML).
    `models_file` is read instead of the directory's `models.yaml` (the rest of the
    directory as usual): `microscheduler add` validates its new file before it replaces
    the old one.
    """
    environ = os.environ
    directory = Path(
        config_dir if config_dir is not None else environ.get(f"{ENV_PREFIX}CONFIG_DIR", "config")
    )
    if not directory.is_dir():
        raise ConfigError([f"{directory}: config directory does not exist"])

    models_path = models_file if models_file is not None else directory / MODELS_FILE
    if not models_path.is_file():
        raise ConfigError([f"{models_path}: file not found (every config directory needs one)"])
    data = _read_yaml(models_path)
    relative_to(directory, data.get("backends"))  # `hf_config:` paths name files beside it
    problems = [
        f"{models_path}: {key}: may only be set through the environment ({ENV_PREFIX}{key.upper()})"
        for key in sorted(_ENV_ONLY & data.keys())
    ] + [
        f"{models_path}: {key}: belongs in {fname} in the same directory"
        for key, fname in _FROM_OTHER_FILES.items()
        if key in data
    ]
    if FLAGS in data:
        problems.append(f"{models_path}: {FLAGS}: {UNKNOWN_KEY}")
    if problems:
        raise ConfigError(problems)
    for key, fname in _FROM_OTHER_FILES.items():
        path = directory / fname
        if path.is_file():
            data[key] = _read_yaml(path)

    values: dict[str, Any] = {**data, FLAGS: {"config_dir": directory, **overrides}}
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, directory, environ, overrides)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        byte = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        raise ConfigError([f"{path}: not UTF-8 text ({byte}): a YAML file is expected"]) from None
    except RecursionError:  # PyYAML composes nodes recursively
        raise ConfigError([f"{path}: invalid YAML: nested too deeply"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}: {where}invalid YAML: {problem}"]) from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            [f"{path}: the top level must be a mapping of keys, not a {type(loaded).__name__}"]
        )
    return loaded


def _describe(
    exc: ValidationError,
    directory: Path,
    environ: Mapping[str, str],
    flags: Mapping[str, Any],
) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        message = err["msg"].removeprefix("Value error, ")
        field, _, rest = message.partition(": ")
        if not loc and rest and field in Settings.model_fields:
            # A check across fields that names the field it refuses (`host: ...`).
            loc, message = [field], rest
        top = loc[0] if loc else ""
        env_name = ENV_PREFIX + "__".join(loc).upper()
        if top in flags:
            source = f"command line --{top.replace('_', '-')}"
        elif top in _FROM_OTHER_FILES:
            source = str(directory / _FROM_OTHER_FILES[top])
            loc = loc[1:]
        elif any(
            env_name == name.upper() or env_name.startswith(name.upper() + "__") for name in environ
        ):
            source = f"environment {env_name}"
        elif top in _ENV_ONLY:
            source = f"environment {ENV_PREFIX}{top.upper()}"
        else:
            source = str(directory / MODELS_FILE)
        key = ".".join(loc)
        for fname in _FROM_OTHER_FILES.values():
            if not loc and message.startswith(f"{fname}: "):
                # A cross-file check (names in one file that another must define).
                source, message = str(directory / fname), message.removeprefix(f"{fname}: ")
        if err["type"] == "missing":
            message = "is required"
        elif err["type"] == "extra_forbidden":
            message = UNKNOWN_KEY
        lines.append(f"{source}: {key}: {message}" if key else f"{source}: {message}")
    return lines

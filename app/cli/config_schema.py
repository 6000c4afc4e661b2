"""`microscheduler config schema [FILE] [--out DIR]`: the JSON Schema of each config file.

One schema per file of a config directory, generated from the settings models
(`app.settings`): `models` (the root `Settings`, less the keys that only the environment
sets and those read from the other files), `cloud_providers`, `gpu_profiles` and `keys`.
Without FILE it prints all four as one JSON object keyed by file name; `--out DIR` writes
`DIR/<file>.schema.json` instead (`--out config/schema` refreshes the shipped copies,
which the config files name on their first line for editors: `# yaml-language-server:
$schema=./schema/models.schema.json`).

The schema checks the shape of a file (keys, types, bounds, enums; an unknown key is an
error: `additionalProperties: false`), not what only the loader can check: what one key
says about another, names that another file must define, environment variables that must
be set. `microscheduler check-config` checks everything.

Where the loader accepts more than the models' types say, the schema says so here: a
chain's short form (`chains: {NAME: [entries]}`) and `hf_config:` (a path, read at load).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, NoDefault
from pydantic_core import core_schema

from app.cli.common import OK, Subparsers, guarded
from app.settings.hf_config import HfConfigFile
from app.settings.loader import _FROM_OTHER_FILES
from app.settings.root import _ENV_ONLY, MODELS_FILE, Settings

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
REFRESH: Final = "microscheduler config schema --out config/schema"

# Input forms a `mode="before"` validator turns into the model, by `$defs` name.
_SHORT_FORMS: Final[dict[str, JsonSchemaValue]] = {
    "ChainConfig": {
        "type": "array",
        "items": {"type": "string"},
        "minItems": 1,
        "description": "Short form: the entries only, tried in order.",
    },
}


class _Generator(GenerateJsonSchema):
    """Pydantic's generator, with the YAML form of the types the loader reads, and no
    title per key (the key's name again; the description says what it is)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def dataclass_schema(self, schema: core_schema.DataclassSchema) -> JsonSchemaValue:
        if schema["cls"] is HfConfigFile:
            return {
                "type": "string",
                "description": "A Hugging Face config.json (or its folder), relative to the "
                "config directory; read once when the configuration is loaded.",
            }
        return super().dataclass_schema(schema)

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        # The lists and mappings a factory makes (`gpus: [0]`, `aliases: []`) are defaults
        # worth showing; a section's factory (`server:`) is its keys' defaults, shown there.
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()  # type: ignore[call-arg]
            return value if isinstance(value, list | dict | tuple) else NoDefault
        return super().get_default_value(schema)

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        # A key pattern comes out as `patternProperties`, which lets a key that does not
        # match it through unchecked: say it as the names' pattern and every value's schema.
        json_schema = super().dict_schema(schema)
        patterns = json_schema.get("patternProperties")
        if (
            isinstance(patterns, dict)
            and len(patterns) == 1
            and ("additionalProperties" not in json_schema)
        ):
            ((pattern, values),) = patterns.items()
            del json_schema["patternProperties"]
            json_schema["propertyNames"] = {"pattern": pattern}
            json_schema["additionalProperties"] = values
        return json_schema


def file_models() -> dict[str, type[BaseModel]]:
    """The model of each file other than models.yaml, by file name without `.yaml`."""
    models: dict[str, type[BaseModel]] = {}
    for field, fname in _FROM_OTHER_FILES.items():
        annotation = Settings.model_fields[field].annotation
        arms: tuple[Any, ...] = ()
        if isinstance(annotation, types.UnionType):
            arms = typing.get_args(annotation)
        model = next((a for a in arms if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            raise TypeError(f"Settings.{field}: expected `SomeConfig | None`, got {annotation}")
        models[Path(fname).stem] = model
    return models


def file_names() -> list[str]:
    """Every config file's name without `.yaml`, models first."""
    return [Path(MODELS_FILE).stem, *file_models()]


def schema_of(name: str) -> JsonSchemaValue:
    """The JSON Schema of config file `name` (`models`, `cloud_providers`, ...)."""
    if name == Path(MODELS_FILE).stem:
        schema = Settings.model_json_schema(schema_generator=_Generator)
        dropped = _ENV_ONLY | _FROM_OTHER_FILES.keys()
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in dropped}
        schema["required"] = [k for k in schema.get("required", []) if k not in dropped]
    else:
        schema = file_models()[name].model_json_schema(schema_generator=_Generator)
    defs = schema.get("$defs", {})
    for def_name, short in _SHORT_FORMS.items():
        if def_name in defs:
            defs[def_name] = {"anyOf": [defs[def_name], short]}
    _prune_defs(schema)
    return {"$schema": DIALECT, **schema, "title": f"{name}.yaml"}


def all_schemas() -> dict[str, JsonSchemaValue]:
    return {name: schema_of(name) for name in file_names()}


def dumps(schema: JsonSchemaValue) -> str:
    """The schema as written to a file: stable, indented, one newline at the end."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _prune_defs(schema: JsonSchemaValue) -> None:
    """Drop the `$defs` no longer referenced (those of the keys taken out)."""
    defs: dict[str, Any] = schema.get("$defs", {})
    used: set[str] = set()
    pending: list[Any] = [{k: v for k, v in schema.items() if k != "$defs"}]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in used:
                    used.add(name)
                    pending.append(defs[name])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    if defs:
        schema["$defs"] = {k: v for k, v in defs.items() if k in used}


def add_config_command(subparsers: Subparsers) -> None:
    """Add `config` with its `schema` sub-command."""
    config = subparsers.add_parser(
        "config",
        help="facts about the configuration files (their JSON Schema)",
        description="Facts about the configuration files.",
    )
    commands = config.add_subparsers(dest="config_command", metavar="{schema}", required=True)
    schema = commands.add_parser(
        "schema",
        help="print (or write) the JSON Schema of the config files",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schema.add_argument(
        "file",
        nargs="?",
        choices=file_names(),
        help="one file's schema (default: all, as one object keyed by file name)",
    )
    schema.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"write DIR/<file>.schema.json instead of printing (refresh: {REFRESH})",
    )
    schema.set_defaults(func=guarded(run_schema, lambda _args: "config schema"))


def run_schema(args: argparse.Namespace) -> int:
    names = [args.file] if args.file else file_names()
    if args.out is None:
        output = schema_of(names[0]) if args.file else all_schemas()
        sys.stdout.write(dumps(output))
        return OK
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.schema.json"
        path.write_text(dumps(schema_of(name)), encoding="utf-8")
        print(path)
    return OK

"""`microscheduler config schema`: the JSON Schema of each config file, the shipped copies
under config/schema/ and the first line of each shipped YAML that names its schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from jsonschema.protocols import Validator

from app.cli import main
from app.cli.config_schema import REFRESH, all_schemas, dumps, file_names

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config"
SCHEMA_DIR = CONFIG / "schema"
SHIPPED = sorted([*CONFIG.glob("*.yaml"), *(CONFIG / "demo").glob("*.yaml")])


def file_of(path: Path) -> str:
    """The config file a shipped YAML is (`keys.example.yaml` is a `keys.yaml`)."""
    return path.name.removesuffix(".yaml").removesuffix(".example")


def validator(name: str) -> Validator:
    checker: Validator = jsonschema.Draft202012Validator(all_schemas()[name])
    return checker


def errors(name: str, data: Any) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator(name).iter_errors(data)]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert isinstance(info.value.code, int)
    return info.value.code, out, err


def test_one_schema_per_file_each_a_valid_json_schema() -> None:
    schemas = all_schemas()
    assert list(schemas) == ["models", "cloud_providers", "gpu_profiles", "keys"]
    for name, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["title"] == f"{name}.yaml"
        assert schema["additionalProperties"] is False


def test_the_models_schema_leaves_out_env_only_keys_and_the_other_files() -> None:
    properties = all_schemas()["models"]["properties"]
    for key in ("api_keys", "admin_key", "config_dir"):
        assert key not in properties
    for key in ("cloud_providers", "gpu_profiles", "client_keys"):
        assert key not in properties
    assert {"backends", "host", "server", "gpu", "schedules"} <= properties.keys()
    assert all_schemas()["models"]["required"] == ["backends"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG)))
def test_every_shipped_config_is_accepted(path: Path) -> None:
    assert errors(file_of(path), yaml.safe_load(path.read_text())) == []


def test_the_kubernetes_configmap_models_yaml_is_accepted() -> None:
    docs = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    (configmap,) = [d for d in docs if d and d.get("kind") == "ConfigMap"]
    assert errors("models", yaml.safe_load(configmap["data"]["models.yaml"])) == []


BACKEND = {"url": "http://127.0.0.1:8000", "models": ["m"]}
WINDOW = {"name": "w", "days": ["mon"], "from": "19:00", "to": "23:00", "action": "yield"}


@pytest.mark.parametrize(
    ("name", "data", "where"),
    [
        ("models", {"backends": {"b": BACKEND}, "hots": "0.0.0.0"}, "[]"),
        ("models", {"backends": {"b": {**BACKEND, "idle_ttl": 5}}}, "['backends', 'b']"),
        ("models", {"backends": {"b": BACKEND}, "server": {"keepalive_s": 5}}, "['server']"),
        (
            "models",
            {"backends": {"b": {**BACKEND, "runtime": {"kind": "docker", "containr": "x"}}}},
            "['backends', 'b', 'runtime']",
        ),
        ("cloud_providers", {"chains": {"c": {"entries": ["a"], "retries": 2}}}, "['chains', 'c']"),
        (
            "gpu_profiles",
            {"profiles": {"p": {"models": {"b": {"vram": 10}}}}},
            "['profiles', 'p', 'models', 'b']",
        ),
        ("keys", {"keys": {"k": {"key_env": "K", "rmp": 5}}}, "['keys', 'k']"),
    ],
)
def test_a_misspelled_key_is_refused(name: str, data: Any, where: str) -> None:
    found = errors(name, data)
    assert found, f"{name}: {data} was accepted"
    assert any(where in line for line in found), found


def _objects(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for value in node.values():
            found += _objects(value)
    elif isinstance(node, list):
        for value in node:
            found += _objects(value)
    return found


def test_every_object_with_keys_forbids_others() -> None:
    for name, schema in all_schemas().items():
        for obj in _objects(schema):
            assert obj.get("additionalProperties") is False, (name, sorted(obj["properties"]))


@pytest.mark.parametrize(
    ("name", "data"),
    [
        # What the loader turns into the model before validating it.
        ("cloud_providers", {"chains": {"reasoning": ["reasoning", "deepseek"]}}),
        ("models", {"backends": {"b": {**BACKEND, "hf_config": "models/m/config.json"}}}),
        ("models", {"backends": {"b": {**BACKEND, "yield": {"method": "sleep", "level": 1}}}}),
        ("models", {"backends": {"b": BACKEND}, "schedules": [WINDOW]}),
    ],
)
def test_the_input_forms_the_loader_reads_are_accepted(name: str, data: Any) -> None:
    assert errors(name, data) == []


def test_a_key_name_outside_the_pattern_is_refused() -> None:
    assert errors("keys", {"keys": {"bad name!": {"key_env": "K"}}})


def test_the_shipped_schema_files_are_current(tmp_path: Path) -> None:
    expected = {f"{name}.schema.json": dumps(all_schemas()[name]) for name in file_names()}
    shipped = {p.name: p.read_text(encoding="utf-8") for p in SCHEMA_DIR.glob("*.json")}
    assert shipped == expected, f"config/schema/ is out of date: run `{REFRESH}`"


def test_the_command_writes_one_file_per_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["config", "schema", "--out", str(tmp_path / "s")], capsys)
    assert code == 0
    written = sorted((tmp_path / "s").iterdir())
    assert [p.name for p in written] == sorted(f"{n}.schema.json" for n in file_names())
    for path in written:
        assert path.read_bytes() == (SCHEMA_DIR / path.name).read_bytes()
    assert out.split() == [str(tmp_path / "s" / f"{n}.schema.json") for n in file_names()]


def test_the_command_prints_all_keyed_by_file_or_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["config", "schema"], capsys)
    assert code == 0
    assert json.loads(out) == all_schemas()
    code, out, _ = run(["config", "schema", "keys"], capsys)
    assert code == 0
    assert json.loads(out) == all_schemas()["keys"]
    code, _, err = run(["config", "schema", "model"], capsys)
    assert code == 2
    assert "invalid choice: 'model'" in err


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIG)))
def test_every_shipped_config_names_its_schema_on_the_first_line(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix)
    target = (path.parent / first.removeprefix(prefix)).resolve()
    assert target == SCHEMA_DIR / f"{file_of(path)}.schema.json"


# config/reference/: every key of each file, with its default and a comment.
REFERENCE = CONFIG / "reference"


def schema_keys(node: Any, root: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key path of a schema: `a.b`, `a.*.b` under a mapping of named items (like
    `backends: {NAME: ...}`), `a[].b` in a list of objects; the arms of a union together."""
    found: set[str] = set()
    for arm in _arms(node, root):
        for key, sub in arm.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            found |= {path} | schema_keys(sub, root, path)
        items = arm.get("additionalProperties")
        if isinstance(items, dict) and _has_keys(items, root):
            found |= schema_keys(items, root, f"{prefix}.*")
        if isinstance(arm.get("items"), dict):
            found |= schema_keys(arm["items"], root, f"{prefix}[]")
    return found


def document_keys(data: Any, node: Any, root: dict[str, Any], prefix: str = "") -> set[str]:
    """The key paths of a YAML document, named items written `*` as in `schema_keys`."""
    found: set[str] = set()
    arms = _arms(node, root)
    if isinstance(data, dict):
        properties = {k: v for arm in arms for k, v in arm.get("properties", {}).items()}
        named = [a["additionalProperties"] for a in arms if _has_keys(a, root, "items")]
        for key, value in data.items():
            if key in properties:
                path = f"{prefix}.{key}" if prefix else key
                found |= {path} | document_keys(value, properties[key], root, path)
            elif named:
                found |= document_keys(value, named[0], root, f"{prefix}.*")
    elif isinstance(data, list):
        items = [a["items"] for a in arms if isinstance(a.get("items"), dict)]
        for value in data:
            found |= document_keys(value, items[0] if items else {}, root, f"{prefix}[]")
    return found


def _arms(node: Any, root: dict[str, Any]) -> list[dict[str, Any]]:
    while isinstance(node, dict) and "$ref" in node:
        node = root["$defs"][node["$ref"].removeprefix("#/$defs/")]
    if not isinstance(node, dict):
        return []
    union = node.get("anyOf") or node.get("oneOf")
    return [arm for sub in union for arm in _arms(sub, root)] if union else [node]


def _has_keys(node: Any, root: dict[str, Any], within: str = "") -> bool:
    """Whether `node` (or its `additionalProperties` with `within`) is an object with keys."""
    if within:
        node = node.get("additionalProperties")
        if not isinstance(node, dict):
            return False
    return any("properties" in arm for arm in _arms(node, root))


def reference(name: str) -> Any:
    return yaml.safe_load((REFERENCE / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", file_names())
def test_the_reference_file_is_accepted_by_the_schema(name: str) -> None:
    assert errors(name, reference(name)) == []


@pytest.mark.parametrize("name", file_names())
def test_the_reference_file_lists_every_key_of_the_schema(name: str) -> None:
    schema = all_schemas()[name]
    missing = schema_keys(schema, schema) - document_keys(reference(name), schema, schema)
    assert not missing, f"config/reference/{name}.yaml lacks {sorted(missing)}"


@pytest.mark.parametrize("name", file_names())
def test_every_key_of_the_reference_file_has_a_comment(name: str) -> None:
    lines = (REFERENCE / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
    bare = [
        line
        for line in lines
        if line.strip()
        and not line.lstrip().startswith("#")
        and "#" not in line
        and not line.rstrip().endswith(":")  # a placeholder name (BACKEND:) or a section
    ]
    assert bare == [], f"config/reference/{name}.yaml: keys without a comment"


def test_the_key_walk_sees_named_items_lists_and_unions() -> None:
    schema = all_schemas()["models"]
    keys = schema_keys(schema, schema)
    assert {"backends.*.url", "backends.*.runtime.container", "schedules[].from"} <= keys
    assert "hosts.*.gpu.prometheus.selector" in keys
    assert "backends.*.runtime.env.*" not in keys  # free-form mappings are one key
    data = {"backends": {"a": {"runtime": {"kind": "docker", "container": "c"}}}}
    assert document_keys(data, schema, schema) == {
        "backends",
        "backends.*.runtime",
        "backends.*.runtime.kind",
        "backends.*.runtime.container",
    }

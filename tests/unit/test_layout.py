"""The layout's rules, checked on the source: no import cycle between app modules
(`TYPE_CHECKING` imports included), no module over 600 lines, at most 10 modules at the top
of `app/`, FastAPI only in the API layer, httpx only behind `app.upstreams.control_http`,
no import that runs back up the floors of `FLOORS`, no class over 40 public members (its
bases in app/ counted with it), no request translated nor upstream body written in the API
(Messages, Ollama); and `tests/unit/` mirrors `app/`'s packages. Read with `ast`; nothing is
imported or run."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
UNIT = Path(__file__).resolve().parent
MAX_LINES = 600
MAX_TOP_LEVEL = 10
# Only the API layer and the app factory speak HTTP-framework.
FRAMEWORK = ("fastapi", "starlette")
FRAMEWORK_ALLOWED = ("app.api", "app.main")


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(APP.rglob("*.py"))}


@functools.cache
def parsed(source: str) -> ast.Module:
    """A module's tree, parsed once for every check that reads it (none changes it)."""
    return ast.parse(source)


def imported(module: str, path: Path) -> Iterator[str]:
    """Every module `module` imports, anywhere in the file (functions and TYPE_CHECKING too)."""
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            assert node.level == 0, f"{module}: use absolute imports"
            yield node.module
            # `from app.api import handlers` imports the module app.api.handlers.
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def app_imports(module: str) -> set[str]:
    return {name for name in imported(module, MODULES[module]) if name in MODULES} - {module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_the_app() -> None:
    assert "app.lifecycle.backend" in MODULES
    assert "app.lifecycle.state" in app_imports("app.lifecycle.backend")


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle_between_app_modules() -> None:
    graph = {module: app_imports(module) for module in MODULES}
    assert cycles(graph) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_600_lines(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by concern"


def test_few_modules_at_the_top_of_app() -> None:
    top = sorted(p.name for p in APP.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules at app/ top level: {top}"


def test_only_the_api_layer_imports_the_web_framework() -> None:
    offenders = sorted(
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if not module.startswith(FRAMEWORK_ALLOWED)
        for name in imported(module, path)
        if name.split(".")[0] in FRAMEWORK
    )
    assert offenders == []


# httpx (no release since 2024-12) is reached through one module, so moving the control
# plane to a maintained fork is a change of that module alone. Tests may import httpx.
HTTPX_OWNER = "app.upstreams.control_http"


def httpx_offences(module: str, path: Path) -> list[str]:
    return [
        f"{module} imports {name}"
        for name in imported(module, path)
        if name.split(".")[0] == "httpx" and module != HTTPX_OWNER
    ]


def test_the_httpx_check_catches_an_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom httpx import AsyncClient\n")
    assert httpx_offences("app.gpu.bad", bad) == [
        "app.gpu.bad imports httpx",
        "app.gpu.bad imports httpx",
        "app.gpu.bad imports httpx.AsyncClient",
    ]
    assert httpx_offences(HTTPX_OWNER, bad) == []


def test_only_the_control_http_module_imports_httpx() -> None:
    assert "httpx" in set(imported(HTTPX_OWNER, MODULES[HTTPX_OWNER]))
    assert [o for m, p in MODULES.items() for o in httpx_offences(m, p)] == []


# The API reads a request and hands it over; what goes on the wire is shaped in routing
# (`app.routing.shaping`, `app.routing.translation`): no API module translates a request
# into another API (Anthropic's request translators, `app.ollama.requests` whole), and the
# Messages and Ollama APIs, whose answers are written by `JSONBody`, the relay and the
# translated streams, write no JSON body themselves (`json_bytes` there would be an
# upstream body). `API_MODULE_NEVER_IMPORTS` holds for a module and the modules under it.
API_NEVER_IMPORTS = frozenset(
    {"app.anthropic.inbound.to_openai_chat", "app.anthropic.inbound.tokenize_request",
     "app.anthropic.to_openai_chat", "app.anthropic.tokenize_request", "app.ollama.requests"}
)  # fmt: skip
API_MODULE_NEVER_IMPORTS = {
    "app.api.messages": frozenset({"app.jsonwire.json_bytes"}),
    "app.api.ollama": frozenset({"app.jsonwire.json_bytes"}),
}


def api_wire_offences(module: str, path: Path) -> list[str]:
    if not module.startswith("app.api"):
        return []
    never = API_NEVER_IMPORTS.union(
        *(names for owner, names in API_MODULE_NEVER_IMPORTS.items()
          if module == owner or module.startswith(owner + "."))
    )  # fmt: skip
    return [f"{module} imports {name}" for name in imported(module, path) if name in never]


def test_the_api_wire_check_catches_a_translation_or_a_body_written(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from app.jsonwire import json_bytes, too_deep\n"
        "from app.anthropic.inbound import anthropic_error, to_openai_chat\n"
        "from app.anthropic import tokenize_request\n"
        "from app.ollama.requests import chat_request\n"
        "from app.ollama import requests, wire\n"
    )
    translators = [
        "imports app.anthropic.inbound.to_openai_chat",
        "imports app.anthropic.tokenize_request",
        "imports app.ollama.requests",
        "imports app.ollama.requests",
    ]
    body = ["imports app.jsonwire.json_bytes"]
    for module in ("app.api.messages", "app.api.ollama", "app.api.ollama.routes"):
        assert api_wire_offences(module, bad) == [f"{module} {o}" for o in body + translators]
    for module in ("app.api.openai", "app.api.ollamas", "app.api.messages_x"):
        assert api_wire_offences(module, bad) == [f"{module} {o}" for o in translators]
    assert api_wire_offences("app.routing.translation", bad) == []


def test_the_api_never_writes_what_goes_on_the_wire() -> None:
    translation = set(imported("app.routing.translation", MODULES["app.routing.translation"]))
    assert {"app.anthropic.inbound.to_openai_chat", "app.ollama.requests"} <= translation
    assert [m for m in MODULES if m.startswith("app.api.ollama.")]  # the rule has its modules
    assert [o for m, p in MODULES.items() for o in api_wire_offences(m, p)] == []


# The planner is pure math: no I/O library, no file reading, nothing of the app but errors.
IO_LIBRARIES = frozenset(
    {"httpx", "aiohttp", "asyncio", "pynvml", "subprocess", "socket", "starlette", "fastapi",
     "os", "shutil", "urllib.request", "yaml", "json", "pydantic", "pydantic_settings"}
)  # fmt: skip
PLANNER_MAY_IMPORT = ("app.planner", "app.errors")
FILE_READING = frozenset({"open", "read_text", "read_bytes", "write_text", "write_bytes"})


def planner_offences(module: str, path: Path) -> list[str]:
    found = []
    for name in imported(module, path):
        top = name.split(".")[0]
        if (
            (top == "app" and not name.startswith(PLANNER_MAY_IMPORT))
            or name in IO_LIBRARIES
            or top in IO_LIBRARIES
        ):
            found.append(f"{module} imports {name}")
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in FILE_READING:
                found.append(f"{module} calls {name}() on line {node.lineno}")
    return found


def test_the_planner_check_catches_io(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom app.settings import Settings\nx = open('f').read()\n")
    assert planner_offences("app.planner.bad", bad) == [
        "app.planner.bad imports httpx",
        "app.planner.bad imports app.settings",
        "app.planner.bad imports app.settings.Settings",
        "app.planner.bad calls open() on line 3",
    ]


def test_the_planner_is_pure() -> None:
    planner = [m for m in MODULES if m == "app.planner" or m.startswith("app.planner.")]
    assert len(planner) > 5
    assert [o for m in planner for o in planner_offences(m, MODULES[m])] == []


# The floors of the house, from the ground up. A room is a package of app/ (or a module at
# its top). A module imports from its own room or from a lower floor, never from its floor
# or above: no arrow runs back up, and rooms on one floor do not know each other. A new
# room gets a floor here (the test fails until it has one).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "metrics", "events", "tasks", "activity", "planner"),
    ("settings", "jsonwire", "logs"),
    ("anthropic",),
    ("upstreams",),
    ("gpu", "keys", "notify", "ollama", "runtimes"),
    ("access", "sim", "store"),
    ("lifecycle",),
    ("vram",),
    ("control",),
    ("routing",),
    ("services",),
    ("reload",),
    ("api",),
    ("main",),
    ("cli",),
)


def room_of(module: str) -> str:
    return module.split(".")[1]


def floor_offences(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    floor = {room: level for level, rooms in enumerate(floors) for room in rooms}
    found = [f"{module} is in no floor" for module in graph if room_of(module) not in floor]
    for module, targets in sorted(graph.items()):
        here = room_of(module)
        for target in sorted(targets):
            there = room_of(target)
            if here != there and floor.get(there, -1) >= floor.get(here, -1):
                found.append(f"{module} imports {target}: {here} is not above {there}")
    return found


def test_the_floor_check_catches_an_arrow_up_and_a_sideways_one() -> None:
    floors = (("errors",), ("upstreams", "gpu"), ("routing",))
    graph = {
        "app.errors": {"app.routing.chains"},  # up
        "app.gpu.nvml": {"app.upstreams.http", "app.errors"},  # sideways, then down
        "app.routing.chains": {"app.routing.local", "app.upstreams.http"},
        "app.keys.ring": set(),
    }
    assert floor_offences(graph, floors) == [
        "app.keys.ring is in no floor",
        "app.errors imports app.routing.chains: errors is not above routing",
        "app.gpu.nvml imports app.upstreams.http: gpu is not above upstreams",
    ]


def test_no_import_runs_back_up_the_floors() -> None:
    graph = {m: app_imports(m) - {"app"} for m in MODULES if m != "app"}
    assert floor_offences(graph, FLOORS) == []


def test_the_unit_tests_mirror_the_app_packages() -> None:
    """`tests/unit/<package>/` holds the tests of `app/<package>/` (each a package, so the
    test modules import as `tests.unit.<package>.<module>`); the tests of `app/`'s
    top-level modules stay in `tests/unit/`."""
    packages = {p.name for p in APP.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= packages, f"tests/unit/ folders with no app package: {folders - packages}"
    # And the other way: every package has its folder (the simulator's tests are tests/sim).
    unmirrored = packages - folders - {"sim"}
    assert not unmirrored, f"app packages without tests/unit/<package>/: {sorted(unmirrored)}"
    for name in sorted(folders):
        assert (UNIT / name / "__init__.py").is_file(), f"tests/unit/{name}/__init__.py"
        assert not list((UNIT / name).glob("*/test_*.py")), f"tests/unit/{name}: one level"


# A class's surface: its public members (methods, properties, class attributes, and the
# attributes its methods set on `self`; public: not starting with `_`), counted together
# with those of its bases defined in app/, so splitting a class into mixins does not
# shrink it. Data is not surface: enum members and the fields of dataclasses, pydantic
# models and named tuples are not counted (their methods and properties are).
MAX_PUBLIC_MEMBERS = 40
DATA_BASES = frozenset(
    {"BaseModel", "BaseSettings", "Enum", "StrEnum", "IntEnum", "Flag", "NamedTuple", "TypedDict"}
)


@dataclass(frozen=True)
class ClassInfo:
    members: frozenset[str]  # its own, fields of data left out
    fields: frozenset[str]  # its class-level names (the fields, when it is data)
    bases: tuple[str, ...]  # "module.Name" for a base in app/, else the bare name
    dataclass: bool


def _class_info(node: ast.ClassDef, names: dict[str, str], module: str) -> ClassInfo:
    members: set[str] = set()
    fields: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            members.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            fields.add(item.target.id)
        elif isinstance(item, ast.Assign):
            fields.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
        ):
            members.add(sub.attr)
    bases = tuple(
        names.get(b.id, f"{module}.{b.id}") if isinstance(b, ast.Name) else ast.unparse(b)
        for b in node.bases
    )
    decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
    return ClassInfo(frozenset(members), frozenset(fields), bases, "dataclass" in decorators)


def classes_of(modules: dict[str, Path]) -> dict[str, ClassInfo]:
    """Every top-level class of `modules`, by "module.Name"."""
    found = {}
    for module, path in modules.items():
        tree = parsed(path.read_text(encoding="utf-8"))
        names = {
            alias.asname or alias.name: f"{node.module}.{alias.name}"
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module is not None
            for alias in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = _class_info(node, names, module)
    return found


def public_members(name: str, classes: dict[str, ClassInfo]) -> set[str]:
    """`name`'s public surface, with its bases' in app/ (see `MAX_PUBLIC_MEMBERS`)."""

    def lineage(cls: str) -> list[str]:
        info = classes[cls]
        return [cls, *(c for b in info.bases if b in classes for c in lineage(b))]

    line = lineage(name)
    ancestors = {b.split(".")[-1] for c in line for b in classes[c].bases}
    data = any(classes[c].dataclass for c in line) or bool(ancestors & DATA_BASES)
    members: set[str] = set()
    for cls in line:
        info = classes[cls]
        members |= info.members if data else info.members | info.fields
    return {m for m in members if not m.startswith("_")}


def member_offences(classes: dict[str, ClassInfo]) -> list[str]:
    return [
        f"{name} has {len(members)} public members (with its bases in app/): split it by "
        f"concern into parts it owns, not into mixins"
        for name in sorted(classes)
        if len(members := public_members(name, classes)) > MAX_PUBLIC_MEMBERS
    ]


def test_the_member_count_sees_through_mixins_and_leaves_data_out(tmp_path: Path) -> None:
    (tmp_path / "half.py").write_text(
        "class Half:\n"
        "    kept: frozenset[str] = frozenset()\n"
        + "".join(f"    def h{i}(self) -> None: ...\n" for i in range(20))
    )
    (tmp_path / "whole.py").write_text(
        "from app.half import Half\n"
        "from pydantic import BaseModel\n"
        "class Whole(Half):\n"
        "    def __init__(self) -> None:\n"
        "        self.name = 'w'\n"
        "        self._private = 0\n"
        + "".join(f"    def w{i}(self) -> None: ...\n" for i in range(19))
        + "class Config(BaseModel):\n"
        + "".join(f"    f{i}: int = 0\n" for i in range(50))
        + "    def method(self) -> None: ...\n"
    )
    classes = classes_of({"app.half": tmp_path / "half.py", "app.whole": tmp_path / "whole.py"})
    assert len(public_members("app.half.Half", classes)) == 21
    assert len(public_members("app.whole.Whole", classes)) == 41  # 20 + 1 + 19 + name
    assert public_members("app.whole.Config", classes) == {"method"}
    assert member_offences(classes) == [
        "app.whole.Whole has 41 public members (with its bases in app/): split it by "
        "concern into parts it owns, not into mixins"
    ]


def test_no_class_has_more_than_40_public_members() -> None:
    classes = classes_of(MODULES)
    assert len(public_members("app.lifecycle.backend.Backend", classes)) > 20
    assert member_offences(classes) == []


E2E = UNIT.parent / "e2e"


def _marked_e2e(tree: ast.Module) -> bool:
    """`pytestmark = pytest.mark.e2e` (or a list holding it) at the module's top."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "pytest.mark.e2e" in ast.unparse(node.value)
    return False


def test_every_e2e_module_carries_the_e2e_mark() -> None:
    """`make test`'s fast first pass runs `-m "not e2e"` over tests/unit, tests/api and
    tests/sim; an unmarked test under tests/e2e would be run by `-m e2e` selections never."""
    unmarked = []
    for path in sorted(E2E.glob("test_*.py")):
        tree = parsed(path.read_text(encoding="utf-8"))
        tests = [
            n for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test")
        ]  # fmt: skip
        if _marked_e2e(tree):
            continue
        unmarked += [
            f"{path.name}::{t.name}"
            for t in tests
            if not any("pytest.mark.e2e" in ast.unparse(d) for d in t.decorator_list)
        ]
    assert unmarked == [], f"tests under tests/e2e without the e2e mark: {unmarked}"

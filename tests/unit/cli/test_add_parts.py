"""The pure parts of `microscheduler add`: the tool parser of a family, the YAML text
added to models.yaml, the `docker create` / `vllm serve` lines, where the model's files
and the caches are, and the plan of the backend."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli.add.backend import Request, plan_backend
from app.cli.add.describe import Description
from app.cli.add.family import tool_parser
from app.cli.add.launch import (
    Mounts,
    argv,
    docker_create,
    docker_creates,
    gpus_flag,
    shell_text,
    vllm_serve,
)
from app.cli.add.source import find_model, hub_cache, vllm_cache_root, weights_size
from app.cli.add.yaml_text import insert_backend
from app.planner.catalog import catalog_model
from app.planner.units import GIB
from app.settings import BackendConfig

# --- the tool parser of a family ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "repo", "parser"),
    [
        ({"model_type": "qwen3"}, "Qwen/Qwen3-8B", "hermes"),
        ({"model_type": "qwen3_moe"}, "Qwen/Qwen3-30B-A3B", "hermes"),
        ({"model_type": "qwen2"}, "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "hermes"),
        ({"model_type": "qwen3_moe"}, "Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        (
            {"model_type": "llama", "rope_scaling": {"rope_type": "llama3"}},
            "meta-llama/Llama-3.1-8B-Instruct",
            "llama3_json",
        ),
        ({"model_type": "llama4"}, "meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama4_pythonic"),
        ({"model_type": "gpt_oss"}, "openai/gpt-oss-20b", "openai"),
    ],
)
def test_known_families_get_the_parser_vllm_registers_for_them(
    config: dict[str, Any], repo: str, parser: str
) -> None:
    found = tool_parser(config, repo)
    assert found is not None
    assert found.name == parser


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama"},  # Llama 2 / 3.0: no llama3 rope, no JSON tool format
        {"model_type": "mistral"},
        {"model_type": "gemma3"},
        {},
    ],
)
def test_other_families_get_no_parser(config: dict[str, Any]) -> None:
    assert tool_parser(config, "some/model") is None


# --- models.yaml's text -----------------------------------------------------------------------

BACKEND: dict[str, object] = {
    "url": "http://127.0.0.1:8001",
    "models": ["new"],
    "runtime": {"kind": "docker", "container": "vllm-new"},
}

EXISTING = """\
# my gateway
docker:
  url: unix:///var/run/docker.sock   # the engine

backends:
    old:                       # indented by four
      url: http://127.0.0.1:8000
      models: [old]
    # a comment inside backends

# the timeouts, after backends
timeouts:
  connect_s: 5
"""


def test_a_backend_is_added_at_the_end_of_backends_keeping_every_line() -> None:
    text = insert_backend(EXISTING, "new", BACKEND, comment="added")
    lines = text.splitlines()
    kept = iter(lines)
    assert all(line in kept for line in EXISTING.splitlines())  # every line, in order
    data = yaml.safe_load(text)
    assert list(data["backends"]) == ["old", "new"]
    assert data["backends"]["new"] == BACKEND
    assert data["timeouts"] == {"connect_s": 5}
    assert "    # added" in lines  # the file's own indentation
    assert lines.index("    # added") < lines.index("# the timeouts, after backends")


def test_a_new_file_gets_a_backends_mapping() -> None:
    text = insert_backend("", "new", BACKEND, comment="added")
    assert text.startswith("backends:\n  # added\n  new:\n")
    assert yaml.safe_load(text) == {"backends": {"new": BACKEND}}


def test_a_file_without_backends_gets_them_at_its_end() -> None:
    text = insert_backend("timeouts:\n  connect_s: 5", "new", BACKEND, comment="added")
    assert yaml.safe_load(text) == {"timeouts": {"connect_s": 5}, "backends": {"new": BACKEND}}


def test_an_empty_flow_mapping_becomes_a_block() -> None:
    text = insert_backend("backends: {}   # none yet\ntimeouts: {}\n", "new", BACKEND, comment="c")
    assert yaml.safe_load(text) == {"backends": {"new": BACKEND}, "timeouts": {}}


def test_backends_written_on_one_line_are_refused() -> None:
    with pytest.raises(ValueError, match="written on one line"):
        insert_backend("backends: {a: {url: x}}\n", "new", BACKEND, comment="c")


# --- the command lines ------------------------------------------------------------------------


def request(**changes: Any) -> Request:
    fields: dict[str, Any] = {
        "name": "qwen3-8b",
        "runtime": "docker",
        "port": 8001,
        "gpus": (0,),
        "model_ref": "Qwen/Qwen3-8B",
        "context": None,
        "kv_dtype": None,
        "lifecycle": "lazy",
        "sleep_mode": True,
        "tool_parser": tool_parser({"model_type": "qwen3"}, "Qwen/Qwen3-8B"),
    }
    return Request(**{**fields, **changes})


SERVE_ARGS = ("Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b", "--enable-sleep-mode")
MOUNTS = Mounts(
    hf_home=Path("/home/me/.cache/huggingface"),
    hub_cache=None,
    vllm_cache=Path("/home/me/.cache/vllm"),
)


def test_docker_create_names_labels_publishes_mounts_and_passes_the_flags() -> None:
    lines = docker_create(
        request(), SERVE_ARGS, {"VLLM_SERVER_DEV_MODE": "1"}, MOUNTS, image="img:1"
    )
    args = argv(lines)
    assert args[:4] == ["docker", "create", "--name", "vllm-qwen3-8b"]
    assert "microscheduler.backend=qwen3-8b" in args
    assert args[args.index("-p") + 1] == "127.0.0.1:8001:8001"
    volumes = [args[i + 1] for i, arg in enumerate(args) if arg == "-v"]
    assert volumes == [
        "/home/me/.cache/huggingface:/root/.cache/huggingface",
        "/home/me/.cache/vllm:/root/.cache/vllm",
    ]
    assert "VLLM_SERVER_DEV_MODE=1" in args
    image = args.index("img:1")
    assert args[image + 1 :] == ["--model", *SERVE_ARGS]  # vLLM's arguments after the image
    assert args[args.index("--gpus") + 1] == "device=0"
    assert shlex.split(shell_text(lines).replace("\\\n", "")) == args


def test_a_hub_cache_of_its_own_and_a_local_model_are_mounted_too() -> None:
    mounts = Mounts(
        hf_home=Path("/hf"),
        hub_cache=Path("/big/hub"),
        vllm_cache=Path("/vc"),
        local_model=Path("/models/mine"),
    )
    args = argv(docker_create(request(), SERVE_ARGS, {}, mounts))
    volumes = [args[i + 1] for i, arg in enumerate(args) if arg == "-v"]
    assert "/big/hub:/root/.cache/huggingface/hub" in volumes
    assert "/models/mine:/models/qwen3-8b:ro" in volumes


def test_a_device_list_is_quoted_inside_the_gpus_value() -> None:
    """Docker's CLI reads `--gpus` as CSV: `"device=0,1"` keeps the list whole."""
    assert gpus_flag([1]) == "device=1"
    assert gpus_flag([0, 1]) == '"device=0,1"'
    lines = docker_create(request(gpus=(0, 1)), SERVE_ARGS, {}, MOUNTS)
    assert "--gpus '\"device=0,1\"' --ipc=host" in shell_text(lines)


def test_one_create_per_placement_differs_only_in_name_and_gpus() -> None:
    creates = docker_creates(request(gpus=(0,), placements=((0,), (1,))), SERVE_ARGS, {}, MOUNTS)
    first, second = (argv(lines) for lines in creates)
    assert (first[3], second[3]) == ("vllm-qwen3-8b-gpu0", "vllm-qwen3-8b-gpu1")
    assert [a for a in first if a not in ("vllm-qwen3-8b-gpu0", "device=0")] == [
        a for a in second if a not in ("vllm-qwen3-8b-gpu1", "device=1")
    ]


def test_vllm_serve_puts_the_environment_first() -> None:
    lines = vllm_serve(request(runtime="process"), SERVE_ARGS, {"VLLM_SERVER_DEV_MODE": "1"})
    assert argv(lines)[:4] == ["VLLM_SERVER_DEV_MODE=1", "vllm", "serve", "Qwen/Qwen3-8B"]


# --- where the files are ----------------------------------------------------------------------


def test_the_hub_cache_follows_huggingface_hubs_variables(tmp_path: Path) -> None:
    assert hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hub_cache({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert vllm_cache_root({"VLLM_CACHE_ROOT": "/v"}) == Path("/v")
    assert vllm_cache_root({"XDG_CACHE_HOME": "/c"}) == Path("/c/vllm")


def snapshot(cache: Path, repo: str, revision: str, config: dict[str, Any]) -> Path:
    folder = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / revision
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_config_of_the_revision_refs_main_names_is_read(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot(cache, "org/m", "old", {"model_type": "old"})
    snapshot(cache, "org/m", "main1", {"model_type": "wanted"})
    refs = cache / "models--org--m" / "refs"
    refs.mkdir()
    (refs / "main").write_text("main1\n")
    found = find_model("org/m", {"HF_HUB_CACHE": str(cache)})
    assert found is not None
    assert found.config == {"model_type": "wanted"}
    assert find_model("org/other", {"HF_HUB_CACHE": str(cache)}) is None


def test_the_weights_come_from_the_index_else_the_files(tmp_path: Path) -> None:
    assert weights_size(tmp_path) == (None, None)
    (tmp_path / "model-1.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "model-2.safetensors").write_bytes(b"x" * 50)
    assert weights_size(tmp_path)[0] == 150
    index = {"metadata": {"total_size": 3 * GIB}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_size(tmp_path)[0] == 3 * GIB


def test_a_local_directory_is_read_before_the_cache(tmp_path: Path) -> None:
    folder = snapshot(tmp_path, "org/m", "r", {"model_type": "local"})
    found = find_model(str(folder), {"HF_HUB_CACHE": str(tmp_path / "none")})
    assert found is not None
    assert found.config_path == folder / "config.json"


# --- the plan ---------------------------------------------------------------------------------


def test_the_backend_is_planned_as_the_gateway_plans_it() -> None:
    description = Description(
        {"catalog": "qwen3-8b"}, catalog_model("qwen3-8b"), {"model_type": "qwen3"}, "catalog"
    )
    planned = plan_backend(request(context=8192), description, 24 * GIB)
    assert planned.plan.ok
    config = BackendConfig.model_validate(planned.data)
    assert config.runtime.kind == "docker"
    assert config.sleep_supported
    args = planned.serve_args
    assert args[0] == "Qwen/Qwen3-8B"
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert args[args.index("--tool-call-parser") + 1] == "hermes"
    assert "--enable-sleep-mode" in args
    assert planned.env == {"VLLM_SERVER_DEV_MODE": "1"}
    flag = planned.plan.flags[0]
    assert args[args.index(flag) + 1] == planned.plan.flags[1]  # the planner's own value
    assert "--host" not in args  # a container listens on its own network namespace


def test_a_process_backend_carries_its_whole_command() -> None:
    description = Description(
        {"catalog": "qwen3-8b"}, catalog_model("qwen3-8b"), {"model_type": "qwen3"}, "catalog"
    )
    planned = plan_backend(
        request(runtime="process", vllm="/opt/vllm/bin/vllm"), description, 24 * GIB
    )
    config = BackendConfig.model_validate(planned.data)
    assert config.runtime.kind == "process"
    command = planned.data["runtime"]["command"]  # type: ignore[index]
    assert command[:3] == ["/opt/vllm/bin/vllm", "serve", "Qwen/Qwen3-8B"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert config.sleep_supported  # the env and the flag, as the gateway infers it

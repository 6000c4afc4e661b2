"""`microscheduler add` through the real parser, in temporary config directories: what it
writes is accepted by check-config's own code path (`run_check_config`), what it refuses
leaves the file as it was."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from app.cli import build_parser
from app.cli.serve import run_check_config
from app.settings import DockerRuntimeConfig, load_settings
from tests.docs import page, section
from tests.fakes.nvml import NoNvml

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def offline_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face home and vLLM cache of the test's own (this machine's real
    caches must not decide what a test sees)."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    return home


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = build_parser().parse_args(["add", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def check_config(directory: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = run_check_config(argparse.Namespace(config=directory), nvml=NoNvml())
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    return out


def test_a_new_config_directory_gets_a_docker_backend_check_config_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "my-config"
    code, out, err = run(
        ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)],
        capsys,
    )
    assert (code, err) == (0, "")
    assert "qwen3-8b: http://127.0.0.1:8001 [docker] serves qwen3-8b" in check_config(
        directory, capsys
    )
    backend = load_settings(directory).backends["qwen3-8b"]
    assert backend.runtime.kind == "docker"
    assert backend.runtime.container == "vllm-qwen3-8b"
    assert backend.sleep_supported
    assert backend.lifecycle == "lazy"
    assert "docker create --name vllm-qwen3-8b" in out
    assert "--tool-call-parser hermes" in out
    assert f"-v {tmp_path / 'hf'}:/root/.cache/huggingface" in out
    assert f"-v {tmp_path / 'vllm-cache'}:/root/.cache/vllm" in out
    assert list(directory.iterdir()) == [directory / "models.yaml"]  # no temporary file left


def test_an_existing_configuration_keeps_every_line_and_stays_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "config"
    shutil.copytree(ROOT / "config", directory)
    before = (directory / "models.yaml").read_text()
    code, out, err = run(
        ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)],
        capsys,
    )
    assert (code, err) == (0, "")
    after = (directory / "models.yaml").read_text()
    rest = iter(after.splitlines())
    assert all(line in rest for line in before.splitlines())  # comments and all, in order
    settings = load_settings(directory)
    assert list(settings.backends) == ["orchestrator", "reasoning", "embeddings", "qwen3-8b"]
    assert settings.timeouts.connect_s == 5  # `timeouts:` after backends is untouched
    # compose's gateway reaches Docker through the proxy, and containers by name:
    assert "put vllm-qwen3-8b on its network" in out
    check_config(directory, capsys)


def test_a_name_in_use_is_refused_and_the_file_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    assert run(argv, capsys)[0] == 0
    before = (directory / "models.yaml").read_bytes()
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: add: backend 'qwen3-8b' is already in ")
    assert (directory / "models.yaml").read_bytes() == before


def test_a_result_check_config_would_refuse_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    models = directory / "models.yaml"
    models.write_text(
        "backends:\n  other:\n    url: http://127.0.0.1:9000\n    models: [x]\n"
        "    aliases: [qwen3-8b]   # the name the new backend serves\n"
    )
    before = models.read_bytes()
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    assert run([*argv, "--dry-run"], capsys)[0] == 1  # a dry run validates too
    code, _, err = run(argv, capsys)
    assert code == 1
    assert "would not be valid with backend 'qwen3-8b'; left unchanged" in err
    assert "qwen3-8b" in err.splitlines()[1]  # the loader's own problem line follows
    assert models.read_bytes() == before
    assert sorted(p.name for p in directory.iterdir()) == ["models.yaml"]


def test_without_a_config_json_it_names_the_flags_that_give_the_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    code, out, err = run(
        ["m", "--model", "someorg/unknown-7b", "--gpu-gib", "24", "--config", str(directory)],
        capsys,
    )
    assert (code, out) == (2, "")
    assert err.startswith("error: add: no config.json for 'someorg/unknown-7b'")
    for flag in (
        "--hf-config",
        "--layers",
        "--kv-heads",
        "--head-dim",
        "--params-b",
        "--weights-gib",
    ):
        assert flag in err
    assert str(tmp_path / "hf" / "hub") in err  # where it looked
    assert not directory.exists()


def test_the_shape_flags_describe_a_model_no_file_describes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    argv = ["m", "--model", "someorg/unknown-7b", "--gpu-gib", "24", "--config", str(directory)]
    argv += ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params-b", "7"]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    info = yaml.safe_load((directory / "models.yaml").read_text())["backends"]["m"]["model_info"]
    assert info == {
        "layers": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "params_b": 7.0,
        "repo": "someorg/unknown-7b",
        "max_model_len": 8192,
    }
    assert "no parser known for this family" in out
    assert "--tool-call-parser" not in out.split("docker create", 1)[1]
    check_config(directory, capsys)


def test_a_config_json_in_the_hugging_face_cache_describes_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], offline_caches: Path
) -> None:
    snapshot = offline_caches / "hub" / "models--org--Coder-7B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"\0" * 1024)
    directory = tmp_path / "c"
    argv = ["coder", "--model", "org/Coder-7B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--context", "16384"], capsys)
    assert (code, err) == (0, "")
    info = load_settings(directory).backends["coder"].model_info
    assert info is not None
    assert (info.layers, info.kv_heads, info.head_dim) == (28, 4, 128)
    assert info.weights_gib == 0.01
    assert info.max_model_len == 16384
    assert "--tool-call-parser hermes" in out  # qwen2, not Qwen3-Coder
    code, _, err = run(["other", *argv[1:], "--context", "65536"], capsys)
    assert code == 2
    assert "more than the model's limit of 32768 tokens" in err


def test_the_process_runtime_writes_its_command_and_prints_vllm_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--runtime", "process", "--port", "8123"], capsys)
    assert (code, err) == (0, "")
    runtime = load_settings(directory).backends["qwen3-8b"].runtime
    assert runtime.kind == "process"
    assert runtime.command[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert runtime.command[runtime.command.index("--port") + 1] == "8123"
    assert runtime.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert "VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-8B" in out
    assert "docker create" not in out
    check_config(directory, capsys)


def test_a_plan_that_does_not_fit_writes_nothing_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    code, out, err = run(
        ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "12", "--config", str(directory)],
        capsys,
    )
    assert (code, err) == (1, "")
    assert "it does not fit, so nothing was written" in out
    assert "why: " in out
    assert "--kv-dtype fp8" in out
    assert "docker create" not in out
    assert not directory.exists()


def test_dry_run_prints_the_block_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--dry-run"], capsys)
    assert (code, err) == (0, "")
    assert "  qwen3-8b:\n    url: http://127.0.0.1:8001\n" in out
    assert "check-config would accept it" in out
    assert "docker create --name vllm-qwen3-8b" in out
    assert not directory.exists()


def test_the_port_is_the_first_no_backend_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    base = ["--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    assert run(["a", *base], capsys)[0] == 0
    assert run(["b", *base], capsys)[0] == 0
    backends = load_settings(directory).backends
    assert (backends["a"].url, backends["b"].url) == (
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8002",
    )


def test_the_first_model_page_shows_what_add_prints_and_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/first-model.md's output and models.yaml, as `add` prints and writes them for
    a user whose home is /home/me (regenerate the page's blocks when the plan changes)."""
    for name in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.chdir(tmp_path)
    text = section(page("first-model"), "2. Add the model")
    command, printed, written = re.findall(r"```(?:sh|text|yaml)\n(.*?)```", text, re.DOTALL)
    argv = shlex.split(command)
    assert argv[:2] == ["microscheduler", "add"]
    code, out, err = run(argv[2:], capsys)
    assert (code, err) == (0, "")
    assert out == printed
    assert (tmp_path / "my-config" / "models.yaml").read_text() == written
    text = section(page("first-model"), "When it does not fit")
    command, excerpt = re.findall(r"```(?:sh|text)\n(.*?)```", text, re.DOTALL)[:2]
    code, out, err = run(shlex.split(command)[2:], capsys)
    assert (code, err) == (1, "")
    shown = [line for line in excerpt.splitlines() if line.strip() != "..."]
    printed_lines = iter(out.splitlines())
    assert all(line in printed_lines for line in shown), out  # in order, "..." elided


def test_the_request_to_try_goes_to_the_gateways_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "models.yaml").write_text(
        "port: 9090\nbackends:\n  a:\n    url: http://127.0.0.1:8000\n    models: [a]\n"
    )
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert "curl -s localhost:9090/v1/chat/completions" in out


QWEN2_CONFIG = {
    "model_type": "qwen2",
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "hidden_size": 3584,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def test_a_local_model_directory_is_mounted_into_the_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "My-Model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN2_CONFIG))
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    directory = tmp_path / "c"
    argv = ["mine", "--model", str(model), "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    info = load_settings(directory).backends["mine"].model_info
    assert info is not None
    assert info.repo == "/models/mine"  # the path vLLM sees in the container
    assert f"-v {model}:/models/mine:ro" in out
    assert "--model /models/mine" in out
    code, out, err = run(["mine2", *argv[1:], "--runtime", "process"], capsys)
    assert (code, err) == (0, "")
    command = load_settings(directory).backends["mine2"].runtime.command  # type: ignore[union-attr]
    assert command[:3] == ["vllm", "serve", str(model)]


def test_hf_config_gives_the_shape_and_the_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "downloaded.json"
    config.write_text(json.dumps(QWEN2_CONFIG))
    directory = tmp_path / "c"
    argv = ["m", "--model", "org/Some-7B", "--gpu-gib", "24", "--config", str(directory)]
    code, _, err = run([*argv, "--hf-config", str(config)], capsys)
    assert code == 2
    assert "--params-b" in err  # a lone config.json has no size of the weights
    code, out, err = run([*argv, "--hf-config", str(config), "--params-b", "7.6"], capsys)
    assert (code, err) == (0, "")
    info = load_settings(directory).backends["m"].model_info
    assert info is not None
    assert (info.layers, info.kv_heads, info.head_dim, info.params_b) == (28, 4, 128, 7.6)
    assert info.weights_dtype == "bf16"
    assert "--tool-call-parser hermes" in out


def test_the_gpu_share_can_be_pinned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "c"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--gpu-memory-utilization", "0.95"], capsys)
    assert (code, err) == (0, "")
    assert "  --gpu-memory-utilization 0.95 \\\n" in out
    info = load_settings(directory).backends["qwen3-8b"].model_info
    assert info is not None
    assert info.gpu_memory_utilization == 0.95


# --- several GPUs: placements and tensor parallel ----------------------------------------------


def create_lines(out: str) -> list[list[str]]:
    """Each printed `docker create` command, as the shell would split it."""
    blocks = [b for b in out.split("\n\n") if b.startswith("docker create")]
    return [shlex.split(block.replace("\\\n", "")) for block in blocks]


def test_placements_write_gpus_auto_and_print_one_create_per_placement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "my-gpus"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--placements", "0", "1"], capsys)

    assert (code, err) == (0, "")
    backend = load_settings(directory).backends["qwen3-8b"]
    assert backend.gpus == "auto"
    assert backend.runtime.kind == "docker"
    assert [(p.gpus, p.container) for p in backend.runtime.placements or []] == [
        ([0], "vllm-qwen3-8b-gpu0"),
        ([1], "vllm-qwen3-8b-gpu1"),
    ]
    first, second = create_lines(out)
    assert first[:4] == ["docker", "create", "--name", "vllm-qwen3-8b-gpu0"]
    assert second[:4] == ["docker", "create", "--name", "vllm-qwen3-8b-gpu1"]
    assert (first[first.index("--gpus") + 1], second[second.index("--gpus") + 1]) == (
        "device=0",
        "device=1",
    )
    # Alike but for the name and the GPU: one port, one label, one vLLM command.
    assert first[5:] == [*second[5:7], "device=0", *second[8:]]
    assert "--tensor-parallel-size" not in first
    assert "one per placement (vllm-qwen3-8b-gpu0, vllm-qwen3-8b-gpu1)" in out
    check_config(directory, capsys)


def test_tensor_parallel_placements_quote_the_device_list_as_dockers_cli_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "my-gpus"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--placements", "0,1", "2,3"], capsys)

    assert (code, err) == (0, "")
    backend = load_settings(directory).backends["qwen3-8b"]
    assert (backend.gpus, backend.tensor_parallel_size, backend.gpu_count) == ("auto", 2, 2)
    assert isinstance(backend.runtime, DockerRuntimeConfig)
    assert [p.gpus for p in backend.runtime.placements or []] == [[0, 1], [2, 3]]
    assert "--gpus '\"device=0,1\"' --ipc=host" in out  # as Docker's docs write it
    first, second = create_lines(out)
    assert first[3] == "vllm-qwen3-8b-gpu0-1"
    assert first[first.index("--gpus") + 1] == '"device=0,1"'
    assert second[second.index("--gpus") + 1] == '"device=2,3"'
    assert first[first.index("--tensor-parallel-size") + 1] == "2"
    assert "  plan per GPU (tensor parallel 2, alone on 2 GPUs of 24 GiB): " in out


def test_a_gpu_list_is_one_tensor_parallel_container(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "tp"
    argv = ["qwen3-8b", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, out, err = run([*argv, "--gpu", "1,0"], capsys)

    assert (code, err) == (0, "")
    backend = load_settings(directory).backends["qwen3-8b"]
    assert isinstance(backend.runtime, DockerRuntimeConfig)
    assert (backend.gpus, backend.runtime.container) == ([0, 1], "vllm-qwen3-8b")
    [line] = create_lines(out)
    assert line[line.index("--gpus") + 1] == '"device=0,1"'
    assert line[line.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--placements", "0", "1", "--runtime", "process"], "is for --runtime docker"),
        (["--placements", "0", "1,2"], "every placement has as many GPUs"),
        (["--placements", "0", "0"], "--placements lists a placement twice"),
        (["--placements", "0", "1", "--gpu", "0"], "give --gpu (one container) or --placements"),
    ],
)
def test_placements_that_cannot_be_created_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    directory = tmp_path / "refused"
    argv = ["q", "--model", "Qwen/Qwen3-8B", "--gpu-gib", "24", "--config", str(directory)]
    code, _, err = run([*argv, *flags], capsys)

    assert code == 2
    assert said in err
    assert not directory.exists()


def test_the_first_model_page_shows_what_add_writes_and_prints_for_placements(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/first-model.md, One container per placement: its command, what it prints (in
    order, "..." elided) and the models.yaml it writes."""
    for name in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.chdir(tmp_path)
    text = section(page("first-model"), "One container per placement")
    command, printed, written = re.findall(r"```(?:sh|text|yaml)\n(.*?)```", text, re.DOTALL)
    argv = shlex.split(command)
    assert argv[:2] == ["microscheduler", "add"]
    code, out, err = run(argv[2:], capsys)
    assert (code, err) == (0, "")
    shown = [line for line in printed.splitlines() if line.strip() != "..."]
    printed_lines = iter(out.splitlines())
    assert all(line in printed_lines for line in shown), out  # in order, "..." elided
    assert (tmp_path / "my-gpus" / "models.yaml").read_text() == written
